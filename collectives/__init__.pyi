# For type checkers only. __init__.py loads its names lazily (so that importing the package does not import
# torch) and so cannot import them where mypy would see them; each module's __all__ says what it exports.
# ruff: noqa: F403
import collectives.elastic as elastic  # noqa: F401, PLR0402 - `hvd.elastic`, a subpackage
from collectives.broadcast_state import *
from collectives.checkpoint import *
from collectives.compression import *
from collectives.context import *
from collectives.coordination import *
from collectives.data import *
from collectives.errors import *
from collectives.features import *
from collectives.lr import *
from collectives.metrics import *
from collectives.objects import *
from collectives.ops import *
from collectives.optimizer import *
from collectives.process_sets import *
from collectives.reduce_op import *
from collectives.startup import *
from collectives.sync_batch_norm import *
