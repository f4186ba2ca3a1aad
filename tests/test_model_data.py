"""The model and the synthetic data: shapes, determinism, learnability."""
import torch

from ablate.config import ModelConfig
from ablate.dataloader import SyntheticBatches
from ablate.model import build as build_model
from ablate.model import count_params


def test_batches_are_a_pure_function_of_seed_and_index():
    a = SyntheticBatches(256, 4, 32, None, seed=1)
    b = SyntheticBatches(256, 4, 32, None, seed=1)
    assert torch.equal(a[7][0], b[7][0]) and not torch.equal(a[7][0], a[8][0])
    x, y = a[3]
    assert x.shape == y.shape == (4, 32)
    assert torch.equal(x[:, 1:], y[:, :-1])   # targets are the inputs shifted by one


def test_variable_length_batches_stay_in_range():
    ds = SyntheticBatches(256, 2, 64, 16, seed=0)
    lengths = {ds[i][0].shape[1] for i in range(40)}
    assert len(lengths) > 5 and min(lengths) >= 16 and max(lengths) <= 64


def test_math_and_sdpa_attention_agree():
    torch.manual_seed(0)
    sdpa = build_model(ModelConfig())
    math_cfg = ModelConfig(attention="math")
    math = build_model(math_cfg)
    math.load_state_dict(sdpa.state_dict())
    x = torch.randint(0, 256, (2, 16))
    assert torch.allclose(sdpa(x), math(x), atol=1e-5)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = build_model(ModelConfig())
    ckpt = build_model(ModelConfig(activation_checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randint(0, 256, (2, 16))
    plain(x, x).backward()
    ckpt(x, x).backward()
    for p, q in zip(plain.parameters(), ckpt.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_named_sizes_have_their_published_parameter_counts():
    # Llama 3.2 1B: 1.24B; Llama 3.1 8B: 8.03B; 70B: 70.6B (model cards)
    from ablate.compose import validate
    from conftest import compose_cfg

    expected = {"1b": 1.24e9, "8b": 8.03e9, "70b": 70.6e9}
    for name, n in expected.items():
        cfg = validate(compose_cfg([f"model={name}"])).model
        model = build_model(cfg, "meta")
        assert abs(count_params(model.net, non_embedding=False) - n) / n < 0.01, name
