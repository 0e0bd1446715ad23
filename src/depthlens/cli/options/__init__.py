"""Reusable option types for every command (``opt.Model``, ``opt.G``, …), one module per concern, all re-exported
here. Types and help texts only: each default is the command's, read from ``depthlens.config`` (``= DTRConfig.g``),
and the one check an option carries is ``finite`` (``base``). tests/test_cli_help.py holds every command's help to
its own options, and docs/cli.md's tables to ``--help``."""

from depthlens.cli.options.base import finite as finite
from depthlens.cli.options.lens import *  # noqa: F403
from depthlens.cli.options.model import *  # noqa: F403
from depthlens.cli.options.readout import *  # noqa: F403
from depthlens.cli.options.sampling import *  # noqa: F403
from depthlens.cli.options.serve import *  # noqa: F403
from depthlens.cli.options.store import *  # noqa: F403
from depthlens.cli.options.tcb import *  # noqa: F403
from depthlens.cli.options.voting import *  # noqa: F403
