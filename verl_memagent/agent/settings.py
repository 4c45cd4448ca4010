"""Settings of the agent loops: limits, retriever, tags and prompt templates, validated at construction.

Each key of an agent's entry in the agent-loop YAML (besides `name` and `_target_`) arrives as a
keyword argument of the loop and lands here; an unknown key or a wrong type fails at once with the
field's name. Prompts are Jinja2 templates; their defaults live in `prompts.yaml` next to this file.

verl builds one loop per sample; `parsed_settings` validates the settings and compiles the prompts
once per process for each distinct agent, tags and settings, and the loops share the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from omegaconf import OmegaConf

from verl_memagent.config_sections import require_choice, typed_section
from verl_memagent.search.endpoint import DEFAULT_RETRIEVER_URL, split_urls

PROMPTS_YAML = Path(__file__).with_name("prompts.yaml")


class MemoryOverflow(str, Enum):
    """`memory_overflow`: what a memory (mem1: state) over its cap does to the trajectory (`AgentSettings`)."""

    END = "end"
    TRUNCATE = "truncate"
    PENALTY = "penalty"


class PromptStyle(str, Enum):
    """`prompt_style`: how contexts are rendered: as the papers' released training code, their released
    inference code (the released checkpoints' input format), or the project's own prompts (docs/fidelity.md)."""

    RELEASED_TRAIN = "released_train"
    RELEASED_EVAL = "released_eval"
    OURS = "ours"


class ActionRules(str, Enum):
    """`action_rules`: how memsearcher and react read MemSearcher's tool-call format: as the released rollout
    and reward, or with the project's stricter rules (agent/parsing.py, grammar.py)."""

    RELEASED = "released"
    STRICT = "strict"


@cache
def default_prompts(agent: str, style: str) -> dict[str, str]:
    """The default templates of one agent and prompt style from prompts.yaml."""
    return dict(OmegaConf.to_container(OmegaConf.load(PROMPTS_YAML)[agent][style]))


@dataclass
class AgentSettings:
    """Everything an agent loop can be told. The defaults are the released MemSearcher training settings
    (the `memsearcher` entry of agent_loops.yaml, docs/fidelity.md); the shipped YAML's entries, which
    verl's registry carries too, set each agent's own.

    Limits (all in tokens of the policy's tokenizer):
      max_turns: LLM contexts per trajectory (react: generate calls).
      max_new_tokens: cap of every generate call.
      memory_max_tokens / memory_overflow: a memory rewrite (memsearcher) whose call hit the token limit
        or that left its memory unclosed, or a memory or internal state (mem1) longer than the cap, ends
        the trajectory there (`end`, the released code), is cut to the cap and the trajectory goes on
        (`truncate`, ours: the model keeps its turn), or ends it with `penalised` set, so rewards give
        0 (`penalty`).
      observation_max_tokens: the formatted documents of one search are cut to this many tokens;
        None: no cap (the released MemSearcher code; the documents are then never encoded on their own).
      context_max_tokens: prompt + response of one context; None means verl's
        rollout.prompt_length + rollout.response_length. Generation stops there (`context_limit`).
      topk: documents per search.
      stop: stop strings sent to the server (vLLM/SGLang `stop`); None means the agent's own.
      sampling_seed: seeds every generate call with a number drawn from this seed, the training
        step, the row's dataset index, the trajectory's session and the call's number (the servers'
        per-request `seed`): a rollout then depends on the weights and the data only, not on which
        requests the server batched together, nor on a restart (a resumed run samples its next step
        as an uninterrupted one would). None (the released code): the server's own random state.

    Format:
      prompt_style: `released_train` renders each context as the paper's released training code did,
        `released_eval` as its released inference code fed the released checkpoints, `ours` with the
        project's prompts (tool schema through the chat template, a turns-left line). Picks the
        default templates of prompts.yaml and the agent's own rules for that style.
      action_rules (memsearcher, and react in MemSearcher's tool-call format): `released` runs every
        tool call of a turn, a malformed one with the released error text as its result, ends the
        trajectory at a turn without a call and records the released reward's verdict on the final
        context; a search in the last turn still runs (and memsearcher's memory rewrite after it).
        `strict` (ours) accepts one well-formed call or one answer in the strict format
        (grammar.py) per turn, ends the trajectory with its reason on anything else, and runs no
        search in the last turn.
      require_state (mem1): a turn without a closed internal-state tag before its action ends the
        trajectory (`no_state`). Off in the released code, which checks no format during rollout.
      released_history_cut (mem1): the next prompt is the whole rolling history cut from the left to
        the rollout's prompt length and then masked to its first prompt-length tokens plus the last turn,
        as the released training code did, so that a long trajectory loses its question; off: the
        prompt is always the question + the last turn (the method's context).
    """

    retriever_urls: list[str] = field(default_factory=lambda: [DEFAULT_RETRIEVER_URL])
    retriever_timeout_s: float = 30.0
    retriever_max_retries: int = 3
    retriever_backoff_s: float = 0.5
    retriever_token: str | None = None
    topk: int = 10
    max_turns: int = 5
    max_new_tokens: int = 512
    memory_max_tokens: int = 1024
    memory_overflow: str = MemoryOverflow.END.value
    observation_max_tokens: int | None = None
    context_max_tokens: int | None = None
    stop: list[str] | None = None
    sampling_seed: int | None = None
    tool_name: str = "wikipedia_search"
    prompt_style: str = PromptStyle.RELEASED_TRAIN.value
    action_rules: str = ActionRules.RELEASED.value
    require_state: bool = False
    released_history_cut: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    prompts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("topk", "max_turns", "max_new_tokens", "memory_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")
        for name in ("observation_max_tokens", "context_max_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer or null, got {getattr(self, name)!r}")
        require_choice("memory_overflow", self.memory_overflow, MemoryOverflow)
        require_choice("prompt_style", self.prompt_style, PromptStyle)
        require_choice("action_rules", self.action_rules, ActionRules)


def build_settings(agent: str, default_tags: dict[str, str], overrides: dict[str, Any]) -> AgentSettings:
    """YAML overrides (plain or OmegaConf values) over the defaults, each of its field's type
    (`config_sections.typed_section`); `retriever_urls` may be one comma-separated string, and null is
    the default (the shipped YAML's `${oc.env:MEMAGENT_RETRIEVER_URL,null}` when the variable is unset)."""
    plain = OmegaConf.to_container(OmegaConf.create(dict(overrides)), resolve=True)
    if isinstance(plain.get("retriever_urls"), str):
        plain["retriever_urls"] = split_urls(plain["retriever_urls"])
    elif "retriever_urls" in plain and plain["retriever_urls"] is None:
        del plain["retriever_urls"]
    merged = typed_section(f"{agent} agent settings", plain, AgentSettings)
    merged.tags = {**default_tags, **merged.tags}
    merged.prompts = {**default_prompts(agent, merged.prompt_style), **merged.prompts}
    return merged


class ByValue:
    """A value as given (plain or OmegaConf), hashed and compared by content, so caches can key on it.

    Leaves compare by type and repr: 1, 1.0 and True are different settings.
    """

    def __init__(self, value: Any):
        self.value = value
        self._key = _content_key(value)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByValue) and self._key == other._key


_LEAF_TYPES = (str, int, float, bool, type(None))


def _content_key(value: Any) -> tuple:
    if isinstance(value, _LEAF_TYPES):
        return (type(value).__name__, repr(value))
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return ("dict", tuple(sorted((repr(k), _content_key(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return ("list", tuple(_content_key(v) for v in value))
    return (type(value).__name__, repr(value))


@cache
def parsed_settings(agent: str, default_tags: ByValue, overrides: ByValue) -> tuple[AgentSettings, Prompts]:
    """The validated settings and compiled prompts of `agent`, built once per process and shared read-only."""
    settings = build_settings(agent, default_tags.value, overrides.value)
    return settings, Prompts(settings)


#: per-call template variables, with sample values for the check at construction
TEMPLATE_VARIABLES = {
    "question": "q",
    "memory": "m",
    "documents": "d",
    "call": "c",
    "turns_left": 2,
    "last_turn": False,
}


class Prompts:
    """The agent's templates compiled once; `render(name, **variables)` fills one in.

    Every template is rendered once at construction, so a typo or an unknown variable fails there,
    naming the template, instead of in the middle of a rollout. A template rendered without
    variables (the system text, a generation prefix) is the same every time: rendered once.
    """

    def __init__(self, settings: AgentSettings):
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
        self._constants = {
            "tags": settings.tags,
            "tool_name": settings.tool_name,
            "memory_max_tokens": settings.memory_max_tokens,
        }
        self._templates = {}
        self._fixed: dict[str, str] = {}
        for name, text in settings.prompts.items():
            try:
                self._templates[name] = env.from_string(text)
                self.render(name, **TEMPLATE_VARIABLES)
            except jinja2.TemplateError as exc:
                known = sorted([*self._constants, *TEMPLATE_VARIABLES])
                raise ValueError(f"prompts.{name}: {exc}; templates may use {known}") from exc

    def render(self, name: str, **variables: Any) -> str:
        """The template `name` filled with `variables` and the settings' constants (tags, tool name, memory cap)."""
        if variables:
            return self._templates[name].render(**self._constants, **variables)
        if name not in self._fixed:
            self._fixed[name] = self._templates[name].render(**self._constants)
        return self._fixed[name]
