"""A trained actor as a transformers model directory, from verl's FSDP checkpoint of it.

verl saves the actor of `global_step_N/actor` as one shard of every parameter per data-parallel rank
(`model_world_size_W_rank_R.pt`, FSDP2 DTensors sharded along a dimension) with its model config and
tokenizer in `huggingface/`. verl's own merger (`python -m verl.model_merger merge --backend fsdp`)
joins the shards, and casts every weight to bfloat16 on the way (model_merger/fsdp_model_merger.py:187,
199): a policy trained and rolled out in float32, as on CPU, then answers otherwise than it did in
training. This merger joins the same shards and keeps their dtype unless told another
(`--dtype bfloat16` gives verl's result), so `verl-memagent eval` and a vLLM server load the policy
the run trained and validated.

    verl-memagent merge checkpoints/global_step_3/actor --out models/step3
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

DTYPES = {"checkpoint": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def shard_files(actor_dir: Path) -> list[Path]:
    """The model shards of one save, in rank order; a clear error if any rank's is missing."""
    found = {}
    for path in actor_dir.glob("model_world_size_*_rank_*.pt"):
        world, rank = map(int, re.fullmatch(r"model_world_size_(\d+)_rank_(\d+)\.pt", path.name).groups())
        found.setdefault(world, {})[rank] = path
    if len(found) != 1:
        raise ValueError(
            f"{actor_dir}: expected the model shards of one save (model_world_size_W_rank_R.pt), found world sizes "
            f"{sorted(found) or 'none'}: point at a checkpoint's actor directory, e.g. checkpoints/global_step_N/actor"
        )
    ((world, ranks),) = found.items()
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        raise ValueError(f"{actor_dir}: the shards of ranks {missing} of {world} are missing (an interrupted save?)")
    return [ranks[rank] for rank in range(world)]


def joined_state_dict(shards: list[Path]) -> dict[str, torch.Tensor]:
    """Each parameter whole: its ranks' local pieces concatenated along the dimension it is sharded on."""
    pieces = [torch.load(path, map_location="cpu", weights_only=False) for path in shards]
    joined = {}
    for name, first in pieces[0].items():
        if not isinstance(first, DTensor):
            joined[name] = first
            continue
        (placement,) = first.placements  # FSDP over one mesh dimension
        if isinstance(placement, Replicate):
            joined[name] = first.to_local()
        elif isinstance(placement, Shard):
            joined[name] = torch.cat([piece[name].to_local() for piece in pieces], dim=placement.dim)
        else:
            raise ValueError(f"{name}: placement {placement} cannot be joined from the saved shards")
    return joined


def merge(actor_dir: str | Path, out: str | Path, dtype: str = "checkpoint") -> Path:
    """Write the transformers model (safetensors, config, tokenizer) of `actor_dir` to `out`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    actor_dir, out = Path(actor_dir), Path(out)
    state = joined_state_dict(shard_files(actor_dir))
    if DTYPES[dtype] is not None:
        state = {name: value.to(DTYPES[dtype]) if value.is_floating_point() else value for name, value in state.items()}
    config = AutoConfig.from_pretrained(actor_dir / "huggingface")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(state, strict=True, assign=True)  # every parameter of the model, none left over
    model.tie_weights()  # assigning broke the tie of a tied lm_head: saved once, as trained
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(actor_dir / "huggingface").save_pretrained(out)
    return out
