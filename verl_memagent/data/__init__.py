"""Dataset preparation: FlashRAG JSON lines to verl parquet, and MEM1's multi-objective composer."""

from verl_memagent.data.compose import compose_multi_objective, to_verl_rows
from verl_memagent.data.flashrag import EVAL_SETS, TRAIN_MIX, QARecord, read_flashrag
from verl_memagent.data.prepare import write_parquet

__all__ = [
    "EVAL_SETS",
    "TRAIN_MIX",
    "QARecord",
    "compose_multi_objective",
    "read_flashrag",
    "to_verl_rows",
    "write_parquet",
]
