"""Sharding: place a model on a mesh by rules over dotted key paths; see README.md."""

from ._mesh import make_mesh as make_mesh
from ._place import filter_shard as filter_shard
from ._place import named_shardings as named_shardings
from ._place import shard as shard
from ._place import shard_batch as shard_batch
from ._plan import PlanRow as PlanRow
from ._plan import ShardingPlan as ShardingPlan
from ._plan import sharding_plan as sharding_plan
from ._strategies import data_parallel as data_parallel
from ._strategies import fsdp as fsdp
from ._strategies import tensor_parallel as tensor_parallel
