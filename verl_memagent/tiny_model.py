"""A tiny randomly initialised Qwen2 and a locally trained tokenizer with a ChatML chat template.

No machine here can reach a model hub, yet tests and the CPU recipes need a real causal LM with
a real tokenizer and chat template. This builds both from nothing: a byte-level BPE trained on
the bundled corpus (so retrieved passages tokenise like text, not bytes) and a Qwen2 with random
weights from a fixed seed. Same seed and corpus give the same model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BUNDLED_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.jsonl"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The agents' tags: trained into the BPE merges so each costs a few tokens, as in Qwen's vocabulary.
AGENT_VOCABULARY = (
    "<think> </think> <search> </search> <answer> </answer> <memory> </memory> "
    "<information> </information> <IS> </IS> <tool_call> </tool_call> <tool_response> "
    "</tool_response> <question> </question> \\boxed{} turns left Doc 1(Title: ) "
    '{"name": "wikipedia_search", "arguments": {"query": ""}}'
)

# Qwen2.5's ChatML layout: system, user, assistant and tool turns, tool schemas in the system turn.
CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}

# Tools

You may call one or more functions to assist with the user query.

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>
{% elif messages[0]['role'] != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}{% if not tools %}<|im_start|>system
{{ message['content'] }}<|im_end|>
{% endif %}
{%- elif message['role'] == 'tool' %}<|im_start|>user
<tool_response>
{{ message['content'] }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the tiny model; defaults give about 1.6M parameters, fast on two CPU cores."""

    vocab_size: int = 4096
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 8192
    seed: int = 0
    tokenizer_passages: int = 4000


def _training_texts(corpus: Path, passages: int):
    with corpus.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= passages:
                break
            yield json.loads(line)["contents"]
    for _ in range(50):
        yield AGENT_VOCABULARY


def build_tokenizer(corpus: Path = BUNDLED_CORPUS, spec: TinyModelSpec = TinyModelSpec()):
    """Train a byte-level BPE on the corpus and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_texts(corpus, spec.tokenizer_passages), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )


def build_model(tokenizer, spec: TinyModelSpec = TinyModelSpec()):
    """A randomly initialised Qwen2ForCausalLM sized for the tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model


def save_tiny_model(out: Path, corpus: Path = BUNDLED_CORPUS, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Build tokenizer and model and save both to `out`, loadable with `from_pretrained(out)`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus, spec)
    tokenizer.save_pretrained(out)
    build_model(tokenizer, spec).save_pretrained(out)
    return out
