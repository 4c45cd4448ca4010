import torch

from verl_memagent.tiny_model import TinyModelSpec, build_model, build_tokenizer


def test_chat_template_renders_chatml_with_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "<question> q </question>"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<question> q </question><|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_turn_is_wrapped_as_tool_response(tokenizer):
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "content": "Doc 1(Title: T) x"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>user\n<tool_response>\nDoc 1(Title: T) x\n</tool_response><|im_end|>" in text


def test_special_tokens_are_single_ids_and_text_roundtrips(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert len(tokenizer.encode("<|im_start|>", add_special_tokens=False)) == 1
    text = "<search> Jeff Porcaro drummer </search>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_model_matches_tokenizer_and_runs_forward(tokenizer, tiny_model):
    assert tiny_model.config.vocab_size == len(tokenizer)
    ids = torch.tensor([tokenizer.encode("Porcaro was an American drummer")])
    logits = tiny_model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_same_seed_gives_same_weights(data_dir):
    spec = TinyModelSpec(tokenizer_passages=200, vocab_size=600)
    tokenizer = build_tokenizer(data_dir / "corpus.jsonl", spec)
    a, b = build_model(tokenizer, spec), build_model(tokenizer, spec)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    c = build_model(tokenizer, TinyModelSpec(tokenizer_passages=200, vocab_size=600, seed=1))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
