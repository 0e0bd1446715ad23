"""Scale-out on Ray (the ``depthlens[ray]`` extra; the only room that imports ``ray``): ``ray`` (connect, the actors'
environment, the one actor-pool driver), ``score`` (``score --ray``) and ``generate`` (``generate --ray``)."""
