"""Evaluation: tasks and their questions (``tasks``, ``loading``), reference checks (``gold``), answer extraction
(``answers``) and grading under a store's answer rules (``grading``). No model, no store."""
