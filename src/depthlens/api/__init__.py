"""The Python front (docs/python.md): the verbs ``depthlens.score``, ``generate``, ``responses``, ``think_at_n`` and
``online`` — each a pyarrow Table, built by the run builder every front shares (``studies.runs``) —, their
keywords (``keywords``, written by ``signatures``), what they show while they run (``progress``), their tables
(``tables``), the records a notebook passes (``records``) and the stores they write for themselves (``scratch``).
``import depthlens`` imports none of this until a verb is first used."""
