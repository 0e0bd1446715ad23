"""The ``depthlens`` command line: typer app, shared option types, one module per verb."""
