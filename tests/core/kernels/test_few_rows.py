"""specscope.core.kernels.few_rows: the few-row linear kernel against F.linear, its fallbacks,
its batch invariance, and its installation into a loaded model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specscope.core import kernels
from specscope.core.kernels import few_rows
from tests.tiny_models import tiny_lm

needs_kernel = pytest.mark.skipif(not kernels.kernel_available(), reason=f"kernel {kernels.kernel_status()}")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("n_in", [1, 7, 8, 13, 576])
@pytest.mark.parametrize("n_out", [1, 17, 1000])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_f_linear_for_every_row_count(n_in, n_out, with_bias, threads):
    gen = torch.Generator().manual_seed(n_in * 1000 + n_out)
    w = torch.randn(n_out, n_in, generator=gen)
    b = torch.randn(n_out, generator=gen) if with_bias else None
    for n_threads in (1, 2):
        threads(n_threads)
        for rows in range(1, kernels.MAX_ROWS + 1):
            x = torch.randn(rows, n_in, generator=gen)
            got = kernels.few_rows_linear(x, w, b)
            assert got.shape == (rows, n_out)
            torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * n_in**0.5)


@needs_kernel
def test_leading_dims_and_strided_input_keep_their_shape():
    w, b = torch.randn(40, 24), torch.randn(40)
    x = torch.randn(1, 6, 48)[..., ::2]  # a (1, 6, 24) view with stride 2: the kernel copies it
    got = kernels.few_rows_linear(x, w, b)
    assert got.shape == (1, 6, 40)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@needs_kernel
def test_a_row_is_the_same_whatever_rows_and_threads_share_the_call(threads):
    """Each output is summed in one order: verifying a position alone or beside seven others,
    on one thread or two, gives the same bits."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(4096, 576, generator=gen)  # large enough for the threaded path
    x = torch.randn(kernels.MAX_ROWS, 576, generator=gen)
    threads(1)
    alone = torch.cat([kernels.few_rows_linear(x[i : i + 1], w) for i in range(len(x))])
    for n_threads in (1, 2):
        threads(n_threads)
        for rows in range(2, kernels.MAX_ROWS + 1):
            assert torch.equal(kernels.few_rows_linear(x[:rows], w), alone[:rows])


@pytest.mark.parametrize(
    "case",
    ["nine rows", "float64", "autograd", "no rows"],
)
def test_what_the_kernel_does_not_take_goes_to_f_linear(case):
    w, x = torch.randn(30, 16), torch.randn(3, 16)
    if case == "nine rows":
        x = torch.randn(kernels.MAX_ROWS + 1, 16)
    elif case == "float64":
        w, x = w.double(), x.double()
    elif case == "autograd":
        w.requires_grad_(True)
    else:
        x = torch.randn(0, 16)
    got = kernels.few_rows_linear(x, w)
    assert torch.equal(got, F.linear(x, w))
    if case == "autograd":
        got.sum().backward()
        assert w.grad is not None and torch.equal(w.grad, x.sum(0).expand(30, 16))


def _tiny_llama() -> torch.nn.Module:
    return tiny_lm(vocab=300, hidden=256, init_range=0.2).eval()  # k_proj, v_proj: 128 x 256, below MIN_WEIGHT


@needs_kernel
def test_install_keeps_the_weights_and_the_greedy_output_and_remove_undoes_it():
    model = _tiny_llama()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[5, 17, 99, 3, 250, 41]])
    with torch.inference_mode():
        before_logits = model(ids[:, :4]).logits
        before = model.generate(ids, max_new_tokens=12, do_sample=False)
    switched = kernels.install(model)
    assert switched == 2 * 5 + 1  # q, o, gate, up, down per layer, and the lm_head
    small = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert len(small) == 2 * 2 and all(m.weight.numel() < few_rows.MIN_WEIGHT for m in small)
    assert kernels.installed(model) and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    with torch.inference_mode():
        torch.testing.assert_close(model(ids[:, :4]).logits, before_logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(ids, max_new_tokens=12, do_sample=False), before)
    assert kernels.remove(model) == switched and not kernels.installed(model)


@needs_kernel
def test_load_model_installs_it_on_cpu_float32_only():
    from specscope.core.loading import bundled_path, load_model

    assert kernels.installed(load_model(bundled_path("target"), device="cpu", role="target"))
    assert not kernels.installed(load_model(bundled_path("target"), device="cpu", dtype="bfloat16", role="target"))


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(few_rows.ENV_SWITCH, "0")
    lib, status = few_rows._load()
    assert lib is None and few_rows.ENV_SWITCH in status


def test_a_failed_build_is_a_reason_not_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    lib, status = few_rows._load()
    assert lib is None and status.startswith("off (the build failed")
    assert list((tmp_path / "kernels").glob("*")) == []  # no half-built file left behind


def test_off_means_install_switches_nothing(monkeypatch):
    monkeypatch.setitem(few_rows._state, "lib", None)
    monkeypatch.setitem(few_rows._state, "status", "off (test)")
    monkeypatch.setitem(few_rows._state, "call", None)
    model = _tiny_llama()
    assert kernels.install(model) == 0 and not kernels.installed(model)
    assert kernels.kernel_status() == "off (test)"


@needs_kernel
def test_a_second_process_finds_the_built_file(tmp_path, monkeypatch):
    """The build lands in <cache>/kernels under a key; building again reuses it."""
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    first, status = few_rows._load()
    assert first is not None and status == "on"
    built = list((tmp_path / "kernels").glob("few_rows-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    again, _ = few_rows._load()
    assert again is not None and built[0].stat().st_mtime_ns == stamp


@needs_kernel
def test_a_head_runs_its_linears_as_its_target_does():
    from specscope.core.draft.heads.eagle3 import load_eagle3
    from specscope.core.loading import bundled_head_path, bundled_path, load_model

    for dtype, expected in (("float32", True), ("bfloat16", False)):
        target = load_model(bundled_path("target"), device="cpu", dtype=dtype, role="target")
        proposer = load_eagle3(bundled_head_path("eagle3-target"))
        proposer.target_features(target)
        assert kernels.installed(proposer.head) is expected


@needs_kernel
@pytest.mark.parametrize(("n_out", "n_in"), [(1000, 576), (17, 13), (300, 7), (40, 256)])
def test_bfloat16_halves_give_the_float32_weights_bits(n_out, n_in, threads):
    """Weights that are exact bfloat16 values, read as their upper halves: the same bits as the
    float32 weights for every row count and thread count (the tail past a multiple of 8 too)."""
    gen = torch.Generator().manual_seed(n_out + n_in)
    w = torch.randn(n_out, n_in, generator=gen).bfloat16().float()
    b = torch.randn(n_out, generator=gen)
    halves = few_rows.bfloat16_halves(w)
    assert halves is not None and halves.dtype == torch.int16 and halves.shape == w.shape
    for n_threads in (1, 2):
        threads(n_threads)
        for rows in range(1, kernels.MAX_ROWS + 1):
            x = torch.randn(rows, n_in, generator=gen)
            assert torch.equal(few_rows.few_rows_linear(x, w, b, halves), few_rows.few_rows_linear(x, w, b))


def test_weights_that_are_not_bfloat16_values_have_no_halves():
    w = torch.randn(64, 64).bfloat16().float()
    assert few_rows.bfloat16_halves(w) is not None
    w[3, 5] += 1e-4  # one weight off the bfloat16 grid
    assert few_rows.bfloat16_halves(w) is None
    assert few_rows.bfloat16_halves(w.bfloat16()) is None  # only float32 weights are read as halves
    assert few_rows.bfloat16_halves(torch.randn(64, 64).bfloat16().float().t()) is None  # nor strided ones


@needs_kernel
def test_a_layer_makes_its_halves_again_when_its_weights_change():
    model = _tiny_llama()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())  # a checkpoint stored in bfloat16, upcast on load
    kernels.install(model)
    head = model.lm_head
    assert head._halves is not None
    x = torch.randn(1, 3, 256)
    with torch.inference_mode():
        assert torch.equal(head(x), few_rows.few_rows_linear(x, head.weight, None))
    with torch.no_grad():  # an in-place update the version counter sees (an optimizer step alike)
        head.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(head(x), F.linear(x, head.weight), rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        head.weight.add_(1e-3)  # off the bfloat16 grid: the float32 weights are read
    with torch.inference_mode():
        torch.testing.assert_close(head(x), F.linear(x, head.weight), rtol=1e-5, atol=1e-4)
    assert head._halves is None
    head.weight = torch.nn.Parameter(torch.randn(300, 256).bfloat16().float())  # a new tensor
    with torch.inference_mode():
        assert torch.equal(head(x), few_rows.few_rows_linear(x, head.weight, None))
    assert head._halves is not None
    kernels.remove(model)
    assert "_halves" not in head.__dict__
