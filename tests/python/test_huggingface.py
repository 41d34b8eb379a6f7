"""Hugging Face integration: a tiny random Qwen3 saved to disk and loaded with
``from_pretrained(dir, device_map="vtpu")`` gives the CPU's logits and the CPU's
greedy tokens. Also checks torch_vtpu.models.Qwen3Mini against transformers' Qwen3.

No network: everything is created locally and HF_HUB_OFFLINE=1 is set before
transformers is imported.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_vtpu  # noqa: E402,F401  (registers the vtpu device)
from torch_vtpu.models import Qwen3Mini, Qwen3MiniConfig  # noqa: E402

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install .[test])")
pytest.importorskip("accelerate", reason="accelerate is not installed (device_map needs it)")

NEW_TOKENS = 16


def _config(tied: bool) -> "transformers.Qwen3Config":
    return transformers.Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        tie_word_embeddings=tied,
        # Wider than the default 0.02 init: a near-uniform random model repeats one
        # token forever, which would make the generation comparison trivial.
        initializer_range=0.2,
    )


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def saved_model(request, tmp_path):
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(_config(request.param)).eval()
    model.save_pretrained(tmp_path)
    return model, tmp_path


def _prompt() -> torch.Tensor:
    return torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(3))


def test_from_pretrained_device_map_vtpu_logits_match_cpu(saved_model):
    cpu_model, path = saved_model
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, device_map="vtpu").eval()
    assert model.device.type == "vtpu"
    assert all(p.device.type == "vtpu" for p in model.parameters())
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "tied weights came apart"
    ids = _prompt()
    with torch.no_grad():
        expected = cpu_model(ids).logits
        actual = model(ids.to("vtpu")).logits
    assert actual.device.type == "vtpu"
    torch.testing.assert_close(actual.cpu(), expected)


def test_generate_greedy_matches_cpu(saved_model):
    cpu_model, path = saved_model
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, device_map="vtpu").eval()
    ids = _prompt()
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    expected = cpu_model.generate(ids, **kwargs)
    actual = model.generate(ids.to("vtpu"), **kwargs)
    assert actual.device.type == "vtpu"
    assert expected.shape == (2, ids.shape[1] + NEW_TOKENS)
    assert len(set(expected[:, ids.shape[1]:].flatten().tolist())) > 2, "degenerate reference sample"
    assert torch.equal(actual.cpu(), expected)


def test_flex_attention_implementation_matches_cpu_sdpa(saved_model):
    # attn_implementation="flex_attention": transformers compiles flex attention and
    # its block mask with torch.compile's default backend; on vtpu both raised before
    # (torch's device check, then Inductor's KeyError: 'vtpu').
    import warnings

    cpu_model, path = saved_model
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, device_map="vtpu",
                                                          attn_implementation="flex_attention").eval()
    assert model.config._attn_implementation == "flex_attention"
    ids = _prompt()
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        with torch.no_grad():
            actual_logits = model(ids.to("vtpu")).logits
            expected_logits = cpu_model(ids).logits
        torch.testing.assert_close(actual_logits.cpu(), expected_logits)
        actual = model.generate(ids.to("vtpu"), **kwargs)
    assert torch.equal(actual.cpu(), cpu_model.generate(ids, **kwargs))


def test_generate_left_padded_batch_matches_cpu(saved_model):
    """Padding exercises the attention-mask path (masked_fill, where, cumsum) on the device."""
    cpu_model, path = saved_model
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, device_map="vtpu").eval()
    ids = _prompt()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ids[1, :3] = 0
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    expected = cpu_model.generate(ids, attention_mask=mask, **kwargs)
    actual = model.generate(ids.to("vtpu"), attention_mask=mask.to("vtpu"), **kwargs)
    assert torch.equal(actual.cpu(), expected)


def test_qwen3_mini_matches_transformers(saved_model):
    """torch_vtpu.models.Qwen3Mini loads a transformers Qwen3 state dict and computes the
    same logits, on the CPU and on vtpu: an independent check of the demo's model."""
    hf_model, _ = saved_model
    hf = hf_model.config
    config = Qwen3MiniConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, intermediate_size=hf.intermediate_size,
        num_hidden_layers=hf.num_hidden_layers, num_attention_heads=hf.num_attention_heads,
        num_key_value_heads=hf.num_key_value_heads, head_dim=hf.head_dim,
        rms_norm_eps=hf.rms_norm_eps, rope_theta=hf.rope_parameters["rope_theta"],
        max_position_embeddings=hf.max_position_embeddings, tie_word_embeddings=hf.tie_word_embeddings,
    )
    mini = Qwen3Mini(config).eval()
    mini.load_state_dict(hf_model.state_dict())
    ids = _prompt()
    with torch.no_grad():
        expected = hf_model(ids).logits
        torch.testing.assert_close(mini(ids), expected)
        torch.testing.assert_close(mini.to("vtpu")(ids.to("vtpu")).cpu(), expected)


def test_mixtral_default_experts_match_cpu(tmp_path):
    """Mixture-of-experts layers count tokens per expert with ``torch.histc`` of an
    int32 tensor on every device but the CPU and MPS (transformers'
    grouped_mm experts): that raised on vtpu, whose histc ran only ATen's CPU
    kernel (floating types). Found by a review of model families."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
        initializer_range=0.2)
    transformers.MixtralForCausalLM(config).eval().save_pretrained(tmp_path)
    cpu_model = transformers.MixtralForCausalLM.from_pretrained(tmp_path).eval()
    model = transformers.MixtralForCausalLM.from_pretrained(tmp_path, device_map="vtpu").eval()
    ids = _prompt()
    with torch.no_grad():
        torch.testing.assert_close(model(ids.to("vtpu")).logits.cpu(), cpu_model(ids).logits)
        expected = cpu_model.generate(ids, max_new_tokens=6, do_sample=False)
        actual = model.generate(ids.to("vtpu"), max_new_tokens=6, do_sample=False)
    assert torch.equal(actual.cpu(), expected)


def _word_tokenizer():
    """A word-level tokenizer over "w0".."w123" built offline (vocabulary of the tiny config)."""
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed (transformers needs it)")
    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(124)]
    model = tokenizers.models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", unk_token="<unk>")


def test_pipeline_keeps_a_model_on_vtpu_there(saved_model):
    # transformers' Pipeline resolved device=None to the CPU for backends it does not
    # know and moved the model (the caller's object too) back there, silently.
    cpu_model, path = saved_model
    tok = _word_tokenizer()
    prompt = "w5 w17 w99 w3"
    generate = dict(max_new_tokens=6, do_sample=False)
    expected = transformers.pipeline("text-generation", model=cpu_model, tokenizer=tok, device="cpu")(
        prompt, **generate)[0]["generated_text"]

    model = transformers.Qwen3ForCausalLM.from_pretrained(path, device_map="vtpu").eval()
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tok)
    assert pipe.device.type == "vtpu" and model.device.type == "vtpu", (pipe.device, model.device)
    assert pipe(prompt, **generate)[0]["generated_text"] == expected

    tok.save_pretrained(path)
    by_map = transformers.pipeline("text-generation", model=str(path), device_map="vtpu")
    assert by_map.device.type == "vtpu" and by_map.model.device.type == "vtpu"
    assert by_map(prompt, **generate)[0]["generated_text"] == expected

    # Models elsewhere and explicit devices are left to transformers.
    on_cpu = transformers.pipeline("text-generation", model=cpu_model, tokenizer=tok)
    assert on_cpu.device.type == "cpu" and cpu_model.device.type == "cpu"
    moved = transformers.pipeline("text-generation", model=model, tokenizer=tok, device="cpu")
    assert moved.device.type == "cpu"


def test_pipeline_patch_applies_when_transformers_was_imported_first(tmp_path):
    import subprocess
    import sys
    program = """
import transformers.pipelines.base as base   # before torch_vtpu (autoload off)
import torch, torch_vtpu
assert getattr(base.Pipeline.__init__, "_vtpu_keeps_model_device", False)
print("patched")
"""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "patched" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("device_map", ["auto", "balanced", "sequential"])
def test_inferred_device_maps_place_the_model_on_vtpu(saved_model, device_map):
    # accelerate knows no vtpu: "auto" put the whole model on the CPU, silently
    cpu_model, path = saved_model
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, device_map=device_map).eval()
    assert {p.device for p in model.parameters()} == {torch.device("vtpu", 0)}
    ids = _prompt()
    with torch.no_grad():
        torch.testing.assert_close(model(ids.to("vtpu")).logits.cpu(), cpu_model(ids).logits)


def test_a_memory_budget_the_caller_gives_is_kept(saved_model):
    from accelerate.utils import get_max_memory

    planned = get_max_memory()
    assert set(planned) == {0}, planned  # host RAM counted once, as the device's
    assert 0 < planned[0] <= torch.vtpu.mem_get_info(0)[0] + (1 << 20)
    assert get_max_memory({"cpu": "1GiB"}) == {"cpu": 1 << 30}
    _, path = saved_model
    model = transformers.Qwen3ForCausalLM.from_pretrained(path, device_map="auto", max_memory={"cpu": "1GiB"})
    assert {p.device.type for p in model.parameters()} == {"cpu"}


class _TokenDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def _train_with_trainer(tmp_path, **overrides):
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(_config(False))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=4, logging_steps=1, report_to=[],
        save_strategy="no", learning_rate=1e-3, seed=0, dataloader_num_workers=0, disable_tqdm=True, **overrides)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_TokenDataset())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return args.device, {p.device for p in model.parameters()}, torch.tensor(losses)


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_trainer_trains_on_vtpu_by_default(tmp_path, bf16):
    # transformers and accelerate chose from their own device lists: the Trainer ran on the CPU
    device, parameter_devices, losses = _train_with_trainer(tmp_path / "vtpu", bf16=bf16)
    assert device == torch.device("vtpu", 0) and parameter_devices == {device}
    cpu_device, cpu_parameter_devices, cpu_losses = _train_with_trainer(tmp_path / "cpu", bf16=bf16, use_cpu=True)
    assert cpu_device.type == "cpu" and cpu_parameter_devices == {torch.device("cpu")}
    assert len(losses) == 4
    # bf16 runs under autocast, whose bfloat16 products round differently per device
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-3 if bf16 else 1e-5, atol=0)


def test_accelerator_defaults_to_vtpu_unless_told_cpu():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    try:
        AcceleratorState._reset_state(reset_partial_state=True)
        assert Accelerator().device == torch.device("vtpu", 0)
        AcceleratorState._reset_state(reset_partial_state=True)
        assert Accelerator(cpu=True).device == torch.device("cpu")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.parametrize("first", ["accelerate", "transformers", "torch_vtpu"])
def test_device_memory_patch_applies_in_any_import_order(first):
    import subprocess
    import sys
    imports = {"accelerate": "import accelerate.utils",
               "transformers": "import transformers.integrations.accelerate",
               "torch_vtpu": "import torch_vtpu"}
    order = [first] + [name for name in imports if name != first]
    program = "\n".join(["import torch"] + [imports[name] for name in order] + [
        "import accelerate.utils, accelerate.utils.modeling as m, transformers.integrations.accelerate as t",
        "import accelerate.state, transformers.training_args as a",
        "for f in (m.get_max_memory, accelerate.utils.get_max_memory, t.accelerate_max_memory,",
        "          accelerate.state.PartialState.default_device.fget, a.TrainingArguments._setup_devices.func):",
        "    assert getattr(f, '_vtpu_device_memory', False), f",
        "assert set(t.get_max_memory()) == {0}",
        "print('patched')",
    ])
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "patched" in out.stdout, out.stderr[-2000:]


def test_safetensors_loads_onto_vtpu_by_name(tmp_path):
    # safetensors parses its device argument itself and refused "vtpu"
    # ("device vtpu is invalid"), which also broke accelerate's checkpoint
    # loading with device_map={"": "vtpu"} (found by review).
    import safetensors.torch as st
    from accelerate.utils import load_checkpoint_in_model
    from safetensors import safe_open

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    path = str(tmp_path / "model.safetensors")
    st.save_file(model.state_dict(), path)
    for device in ("vtpu", "vtpu:0", torch.device("vtpu"), torch.device("vtpu", 0), 0):
        loaded = st.load_file(path, device=device)
        assert {t.device for t in loaded.values()} == {torch.device("vtpu", 0)}, device
        assert torch.equal(loaded["weight"].cpu(), model.weight.detach())
    with safe_open(path, "pt", "vtpu") as f:  # device given by position
        assert f.get_tensor("bias").device.type == "vtpu"
    assert st.load_file(path, device="cpu")["bias"].device.type == "cpu"
    with pytest.raises(RuntimeError, match="vtpu:1"):
        st.load_file(path, device="vtpu:1")
    target = torch.nn.Linear(4, 3).to("vtpu")
    st.load_model(target, path, device="vtpu")
    assert torch.equal(target.weight.cpu(), model.weight.detach())
    dispatched = torch.nn.Linear(4, 3)
    load_checkpoint_in_model(dispatched, path, device_map={"": "vtpu"})
    assert dispatched.weight.device.type == "vtpu" and torch.equal(dispatched.bias.cpu(), model.bias.detach())


def test_safetensors_patch_applies_when_it_was_imported_first(tmp_path):
    import subprocess
    import sys
    program = f"""
import safetensors.torch as st, accelerate.utils.modeling as modeling  # before torch_vtpu (autoload off)
import torch, torch_vtpu
st.save_file({{"x": torch.ones(2)}}, {str(tmp_path / "x.safetensors")!r})
assert st.load_file({str(tmp_path / "x.safetensors")!r}, device="vtpu")["x"].device.type == "vtpu"
assert modeling.safe_open is st.safe_open
print("patched")
"""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "patched" in out.stdout, out.stderr[-2000:]
