"""`tp.torch.load_state_dict`: a checkpoint as `module.state_dict()` names, tied weights too."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import trackpoint as tp  # noqa: E402
from trackpoint.errors import NotFoundError  # noqa: E402


class TiedLM(torch.nn.Module):
    """GPT-2's layout in small: the output head shares the token embedding's weight."""

    def __init__(self, vocab: int = 11, width: int = 4) -> None:
        super().__init__()
        self.transformer = torch.nn.Module()
        self.transformer.wte = torch.nn.Embedding(vocab, width)
        self.transformer.ln_f = torch.nn.LayerNorm(width)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        self.register_buffer("counter", torch.tensor(3))


def _transformers_gpt2():  # noqa: ANN202
    """A tiny transformers GPT-2 (no download) when transformers is installed, else None."""
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=17, n_positions=8)
    return transformers.GPT2LMHeadModel(config)


def test_tied_weight_comes_under_every_state_dict_name(tmp_path):
    model = _transformers_gpt2() or TiedLM()
    prefix = tp.Checkpoint(model=model).write(tmp_path / "ckpt")
    # The save stores the tied weight once, under the first path found.
    stored = [k for k in tp.load_checkpoint(prefix).keys() if "wte" in k or "lm_head" in k]
    assert len(stored) == 1
    state = tp.torch.load_state_dict(prefix, root="model")
    expected = model.state_dict()
    assert list(state) == list(expected)  # same names, same order
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    assert state["lm_head.weight"] is state["transformer.wte.weight"]
    fresh = _transformers_gpt2() or TiedLM()
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)


def test_bfloat16_and_float8_keep_their_dtype(tmp_path):
    module = torch.nn.Linear(3, 2).to(torch.bfloat16)
    module.register_buffer("scale", torch.tensor([0.5, 2.0]).to(torch.float8_e4m3fn))
    prefix = tp.Checkpoint(model=module).write(tmp_path / "ckpt")
    state = tp.torch.load_state_dict(prefix, "model")
    assert state["weight"].dtype == torch.bfloat16
    assert state["scale"].dtype == torch.float8_e4m3fn
    assert torch.equal(state["weight"], module.weight.detach())
    assert torch.equal(state["scale"].view(torch.uint8), module.scale.view(torch.uint8))
    state["weight"].add_(1)  # the tensors own their memory: writable, the file is closed


def test_root_spellings_and_the_whole_checkpoint(tmp_path):
    model = TiedLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    prefix = tp.Checkpoint(model=model, optimizer=opt).save(tmp_path / "ckpt")
    assert list(tp.torch.load_state_dict(prefix, "model.transformer")) == [
        "wte.weight",
        "ln_f.weight",
        "ln_f.bias",
    ]
    assert list(tp.torch.load_state_dict(prefix, "model/transformer/ln_f")) == ["weight", "bias"]
    whole = tp.torch.load_state_dict(tmp_path)  # a directory: its latest checkpoint
    assert "save_counter" not in whole  # the Checkpoint's own counter is no module's
    assert "model.lm_head.weight" in whole and "model.transformer.wte.weight" in whole
    assert not any(isinstance(v, str) for v in whole.values())
    with pytest.raises(NotFoundError, match="decoder"):
        tp.torch.load_state_dict(prefix, "model.decoder")


def test_checkpoint_without_object_graph(tmp_path):
    from trackpoint.bundle import BundleWriter

    with BundleWriter(str(tmp_path / "tf1")) as writer:
        writer.add("dense/kernel", np.ones((2, 3), np.float32))
        writer.add("dense/bias", np.zeros(3, np.float32))
    state = tp.torch.load_state_dict(tmp_path / "tf1", "dense")
    assert sorted(state) == ["bias", "kernel"]
    assert state["kernel"].shape == (2, 3)


def test_device_argument(tmp_path):
    prefix = tp.Checkpoint(model=torch.nn.Linear(2, 2)).write(tmp_path / "ckpt")
    state = tp.torch.load_state_dict(prefix, "model", device=torch.device("cpu"))
    assert all(t.device.type == "cpu" for t in state.values())
    meta = tp.torch.load_state_dict(prefix, "model", device="meta")
    assert all(t.device.type == "meta" for t in meta.values())
