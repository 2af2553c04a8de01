"""The CPU kernels that stand in for a release's CUDA, CuTe-DSL and Triton kernels, each checked
against its definition (the layouts the release's own code writes or reads)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fp4lab.compile import fix
from fp4lab.fp4 import encodings, swizzle
from fp4lab.serving.replay.release import (
    attention,
    cpu_graph_kernels,
    cpu_kernels,
    cpu_moe_kernels,
    cpu_quant_kernels,
    kernels,
    setup_standins,
    triton_ops,
)


def test_mxfp8_blocks_take_the_smallest_power_of_two_scale_and_round_to_e4m3():
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 64)
    codes, scales = cpu_quant_kernels.mxfp8_quantize(x, is_sf_swizzled_layout=False)
    scale = torch.exp2(scales.float() - 127).repeat_interleave(32, dim=1)
    assert codes.dtype == torch.float8_e4m3fn and scales.shape == (5, 2)
    assert (codes.float().abs().amax() <= 448) and (
        codes.float().view(5, 2, 32).abs().amax(-1) > 224
    ).all()
    assert ((codes.float() * scale - x).abs() <= x.abs() * 2**-4 + scale * 2**-10).all()
    swizzled = cpu_quant_kernels.mxfp8_quantize(x)[1]
    assert swizzled.shape == (128 * 4,) and torch.equal(
        swizzle.unswizzle_128x4(swizzled, 5, 2), scales
    )


def test_the_chunked_prefix_gather_writes_each_requests_slots_at_its_offset():
    req_to_token = torch.arange(4 * 50, dtype=torch.int32).view(4, 50)
    pool, starts = torch.tensor([2, 0, 3]), torch.tensor([5, 0, 10])
    lens = torch.tensor([3, 4, 2])
    cu = torch.tensor([0, 3, 7, 9], dtype=torch.int32)
    out = torch.full((12,), -1, dtype=torch.int32)
    cpu_graph_kernels.Launch(cpu_graph_kernels.chunked_prefix_kv_indices)[(3,)](
        req_to_token, pool, starts, lens, cu, out, 50
    )
    want = torch.cat([req_to_token[2, 5:8], req_to_token[0, 0:4], req_to_token[3, 10:12]])
    assert torch.equal(out[:9], want) and (out[9:] == -1).all(), out
    whole = torch.full((12,), -1, dtype=torch.int32)  # each request from slot 0 (no start given)
    cpu_graph_kernels.Launch(cpu_graph_kernels.flashinfer_kv_indices)[(3,)](
        req_to_token, pool, lens, cu, None, whole, 50
    )
    want = torch.cat([req_to_token[2, :3], req_to_token[0, :4], req_to_token[3, :2]])
    assert torch.equal(whole[:9], want) and (whole[9:] == -1).all(), whole


def test_the_mla_key_concat_puts_the_rope_head_after_each_heads_nope_part():
    k = torch.empty(3, 4, 6, dtype=torch.bfloat16)
    nope, rope = torch.randn(3, 4, 4), torch.randn(3, 1, 2)
    cpu_kernels.concat_and_cast_mha_k(k, nope, rope)
    assert torch.equal(k, torch.cat([nope, rope.expand(3, 4, 2)], -1).to(torch.bfloat16))


def test_the_fused_fc1_swiglu_quantize_equals_its_parts_on_the_interleaved_weight():
    """The release interleaves [up; gate] in 64-row chunks (``interleave_linear_and_gate``); the
    stand-in's output is the NVFP4 quantize of up * silu(gate) from the plain GEMM."""
    g = torch.Generator().manual_seed(1)
    x, up, gate = (torch.randn(rows, 64, generator=g) for rows in (8, 128, 128))
    one = torch.tensor(1.0)
    interleaved = torch.stack([up.view(2, 64, 64), gate.view(2, 64, 64)], 1).reshape(256, 64)
    qx, sx = fix.reference_fp4_quantize(x, one)
    qw, sw = fix.reference_fp4_quantize(interleaved, one)
    codes, scales = cpu_kernels.nvfp4_gemm_swiglu_quant(qx, sx, qw, sw, one, one)
    acc = cpu_kernels.fp4_gemm(qx, qw, sx, sw, one, torch.float32, 256).view(8, 2, 2, 64)
    hidden = (acc[:, :, 0] * torch.nn.functional.silu(acc[:, :, 1])).reshape(8, 128)
    want_codes, want_scales = cpu_kernels.fp4_bytes(hidden, one, True)
    assert torch.equal(codes, want_codes) and scales.dtype == torch.float8_e4m3fn
    assert torch.equal(scales.view(torch.uint8), want_scales.view(torch.uint8))


def test_the_kv_pool_reads_mlas_latent_cache_back_as_written_in_its_dtype():
    """DeepSeek's one-shot MHA prefill writes the batch's latent cache, then reads it back by the
    batch's KV indices: the stand-in pool gives the latent and its RoPE part as written."""
    pool, layer = attention.KVPool(1, torch.bfloat16, 1, 8), types.SimpleNamespace(layer_id=3)
    nope, rope = torch.randn(5, 1, 6), torch.randn(5, 1, 2)
    loc = torch.tensor([7, 2, 9, 4, 0])
    pool.set_mla_kv_buffer(layer, loc, nope, rope)
    got_nope, got_rope = pool.get_mla_kv_buffer(layer, loc[[1, 3]], torch.float32)
    assert got_nope.shape == (2, 1, 6) and got_rope.shape == (2, 1, 2)
    assert torch.equal(got_nope, nope[[1, 3]].bfloat16().float())
    assert torch.equal(got_rope, rope[[1, 3]].bfloat16().float())


def test_the_mxfp_upcast_is_each_e2m1_code_times_its_blocks_power_of_two_along_the_axis():
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (2, 3, 64), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 134, (2, 3, 2), generator=g, dtype=torch.uint8)
    want = encodings.e2m1_decode(codes) * torch.exp2(scales.float() - 127).repeat_interleave(32, -1)
    packed = encodings.pack_e2m1(codes)
    got = cpu_quant_kernels.upcast_from_mxfp(packed, scales, -1, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want)
    across = cpu_quant_kernels.upcast_from_mxfp(
        packed.transpose(1, 2).contiguous(),
        scales.transpose(1, 2).contiguous(),
        1,
        dtype=torch.float32,
    )
    assert torch.equal(across, want.transpose(1, 2))
    rows = torch.tensor([[1.0, 2.0, 0.5], [4.0, 1.0, 0.25]])  # one scale per row across the axis
    scaled = cpu_quant_kernels.upcast_from_mxfp(
        packed, scales, -1, torch.float32, tensor_scale=rows
    )
    assert torch.equal(scaled, want * rows[..., None])


def test_per_token_group_quant_scales_each_group_to_the_code_range_and_packs_ue8m0_exponents():
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)) * torch.logspace(-2, 2, 64)
    q, s = torch.empty(3, 64, dtype=torch.float8_e4m3fn), torch.empty(3, 2)
    cpu_quant_kernels.per_token_group_quant(x.bfloat16(), q, s, 32)
    groups = q.float().view(3, 2, 32)
    assert torch.equal(groups.abs().amax(-1), torch.full((3, 2), 448.0))
    back, want = (groups * s.unsqueeze(-1)).view(3, 64), x.bfloat16().float()
    step = s.repeat_interleave(32, -1) * 2**-9  # e4m3's smallest step, in the group's scale
    assert ((back - want).abs() <= want.abs() * 2**-3 + step).all()
    packed = torch.empty(3, 1, dtype=torch.int32)
    cpu_quant_kernels.per_token_group_quant(x.bfloat16(), q, packed, 32, scale_ue8m0=True)
    exponents = packed.view(torch.uint8).view(3, 4)
    assert (exponents[:, 2:] == 0).all(), "the word's unused bytes stay zero"
    power = torch.exp2(exponents[:, :2].float() - 127)
    assert ((power >= s) & (power < 2 * s)).all(), "the smallest power of two at or above"
    fused = torch.empty(3, 32, dtype=torch.float8_e4m3fn)
    cpu_quant_kernels.per_token_group_quant(x, fused, torch.empty(3, 1), 32, fuse_silu_and_mul=True)
    act = torch.nn.functional.silu(x[:, :32]) * x[:, 32:]
    assert torch.equal(fused.float().abs().amax(-1), torch.full((3,), 448.0))
    scale = act.abs().amax(-1, keepdim=True) / 448
    assert ((fused.float() * scale - act).abs() <= act.abs() * 2**-3 + scale * 2**-9).all()


def _moe_by_token(x, w1, w2, weights, ids, act, b1=None, b2=None):
    """The MoE token by token, slot by slot: the definition the stand-in is held to."""
    want = torch.zeros(x.shape[0], w2.shape[1])
    for token, slot in ((t, k) for t in range(ids.shape[0]) for k in range(ids.shape[1])):
        e = int(ids[token, slot])
        if e >= 0:
            h = x[token] @ w1[e].T + (0 if b1 is None else b1[e])
            want[token] += weights[token, slot] * (act(h) @ w2[e].T + (0 if b2 is None else b2[e]))
    return want


def test_the_triton_moe_is_each_tokens_experts_by_definition_and_binds_each_releases_order():
    g = torch.Generator().manual_seed(4)
    x, w1 = torch.randn(5, 8, generator=g), torch.randn(3, 8, 8, generator=g)
    w2, b1, b2 = (
        torch.randn(3, 8, 4, generator=g),
        torch.randn(3, 8, generator=g),
        torch.randn(3, 8, generator=g),
    )
    ids = torch.tensor([[0, 2], [1, -1], [2, 2], [0, 1], [-1, 1]])  # -1: an expert filtered out
    weights = torch.rand(5, 2, generator=g)

    def swiglu_oai(h):
        gate, up = h[::2].clamp(max=7.0), h[1::2].clamp(-7.0, 7.0)
        return gate * torch.sigmoid(gate * 1.702) * (up + 1)

    given = dict(hidden_states=x.clone(), w1=w1, w2=w2, topk_weights=weights, topk_ids=ids, b1=b1,
                 b2=b2, inplace=True, gemm1_alpha=1.702, gemm1_limit=7.0, routed_scaling_factor=2.0)  # fmt: skip
    out = cpu_moe_kernels.triton_fused_experts(**given)
    want = _moe_by_token(x, w1, w2, weights, ids, swiglu_oai, b1, b2)
    assert out is given["hidden_states"] and torch.allclose(out, 2 * want, atol=1e-5)

    def release(hidden_states, w1, w2, topk_weights, topk_ids, b1=None, b2=None, inplace=False,
                activation="silu", apply_router_weight_on_input=False, use_fp8_w8a8=False):  # fmt: skip
        raise AssertionError("the stand-in runs instead")

    bound = cpu_moe_kernels.ByReleaseSignature(cpu_moe_kernels.triton_fused_experts).bound_to(
        release
    )
    gelu = bound(x, w1, w2, weights, ids, None, None, False, "gelu")  # positional, as it calls
    halves = _moe_by_token(x, w1, w2, weights, ids,
                           lambda h: torch.nn.functional.gelu(h[:4]) * h[4:])  # fmt: skip
    assert torch.allclose(gelu, halves, atol=1e-5)
    with pytest.raises(NotImplementedError, match="use_fp8_w8a8"):
        bound(x, w1, w2, weights, ids, use_fp8_w8a8=True)
    with pytest.raises(cpu_moe_kernels.CallRefused, match="unexpected keyword argument 'dtype'"):
        bound(x, w1, w2, weights, ids, dtype=torch.bfloat16), "as the real function refuses it"


def test_a_stand_in_installed_twice_stays_bound_to_the_releases_own_signature(monkeypatch):
    """A table installed again (a fork sets up what its parent had) binds its stand-in to the
    release's function, not to the stand-in before it; a call that function refuses is refused."""
    module = types.ModuleType("fp4lab_release_like")

    def upcast_from_mxfp(tensor, scale, target_dtype, axis):
        raise AssertionError("the stand-in runs instead")

    module.upcast_from_mxfp = upcast_from_mxfp
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(kernels, "ORIGINALS", {})
    table = ((module.__name__, "upcast_from_mxfp",
              cpu_moe_kernels.ByReleaseSignature(cpu_quant_kernels.upcast_from_mxfp), "why"),)  # fmt: skip
    for _ in range(2):
        [done] = kernels.installed(table, "load_time")
    codes = torch.zeros(1, 3, 16, dtype=torch.uint8)
    scales = torch.full((1, 3, 1), 127, dtype=torch.uint8)
    assert module.upcast_from_mxfp(codes, scales, torch.bfloat16, -1).shape == (1, 3, 32)
    with pytest.raises(
        cpu_moe_kernels.CallRefused, match="missing a required argument: 'target_dtype'"
    ):
        module.upcast_from_mxfp(codes, scales, dtype=torch.bfloat16, axis=-1)
    assert done["name"] == "upcast_from_mxfp_load_time"


def test_minimaxs_qk_norm_in_two_passes_is_rmsnorm_of_q_and_k_and_an_opaque_op_when_traced():
    """The sum-of-squares pass, then the apply pass, give torch's RMSNorm of each of q and k (one
    rank); traced, each is one ``fp4lab_triton`` node, as dynamo takes a Triton launch."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 64, generator=g).bfloat16(), torch.randn(3, 32, generator=g).bfloat16()
    wq, wk = torch.rand(64, generator=g).bfloat16(), torch.rand(32, generator=g).bfloat16()
    sums = triton_ops.rms_sumsq(q, k)
    assert sums.shape == (8,) and sums.dtype == torch.float32, "2 x 3 rows, padded to 4"
    got = triton_ops.rms_apply(q, k, wq, wk, sums, 1, 1e-6)
    for x, w, out in ((q, wq, got[0]), (k, wk, got[1])):
        want = torch.nn.functional.rms_norm(x.float(), (x.shape[1],), w.float(), 1e-6)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda a, b: triton_ops.rms_apply_launch(a, b, wq, wk, triton_ops.rms_sumsq_launch(a, b))
    )(q, k)
    called = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert [str(t) for t in called if "fp4lab_triton" in str(t)] == [
        "fp4lab_triton.rms_sumsq_serial.default", "fp4lab_triton.rms_apply_serial.default"]  # fmt: skip


def test_the_moe_finalize_sums_each_tokens_weighted_fc2_rows_and_the_shared_output():
    """Each token's slots read their permuted FC2 row (a dropped slot, -1, reads none), weighted
    and summed, plus the shared output; the TRT-LLM stand-in's deferred outputs finalize to the
    shared output alone (its routed experts contribute zero either way)."""
    g = torch.Generator().manual_seed(0)
    rows, top_k, width = 3, 2, 8
    gemm2 = torch.randn(rows * top_k, width + 4, generator=g).bfloat16()
    slots = torch.tensor([5, 0, 2, -1, 1, 4], dtype=torch.int32)
    weights = torch.rand(rows, top_k, generator=g).bfloat16()
    shared = torch.randn(rows, width, generator=g).bfloat16()
    got = cpu_moe_kernels.moe_finalize(gemm2, slots, weights, shared, top_k)
    want = shared.float().clone()
    for token in range(rows):
        for k in range(top_k):
            slot = int(slots[token * top_k + k])
            if slot >= 0:
                want[token] += weights[token, k].float() * gemm2[slot, :width].float()
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    assert not torch.equal(got, shared), "the routed rows count"
    hidden = torch.zeros(rows, width // 2, dtype=torch.uint8)
    deferred = cpu_moe_kernels.trtllm_fp4_moe_zero(hidden_states=hidden, top_k=top_k,
                                                   do_finalize=False)  # fmt: skip
    assert [t.dtype for t in deferred] == [torch.bfloat16, torch.bfloat16, torch.int32]
    assert torch.equal(cpu_moe_kernels.moe_finalize(deferred[0], deferred[2],
                                                    deferred[1], shared, top_k), shared)  # fmt: skip


def test_flashinfers_cubin_downloads_fail_at_once_and_say_so(monkeypatch, caplog, tmp_path):
    """On a machine that reaches no NVIDIA server FlashInfer's download returns False after 35 s
    of retries; stood in, it returns False at once, naming what it did not fetch."""
    import importlib

    held = [importlib.import_module(n) for n in setup_standins.CUBIN_FETCHERS]
    for module in held:
        monkeypatch.setattr(module, "download_file", module.download_file)
    [record] = setup_standins.cubin_downloads_refused()
    assert record["boundary"] == ", ".join(
        f"{n}.download_file" for n in setup_standins.CUBIN_FETCHERS
    )
    with caplog.at_level("WARNING", logger="fp4lab.cubins"):
        assert (
            held[0].download_file("https://example.invalid/checksums.txt", tmp_path / "c") is False
        )
    assert "https://example.invalid/checksums.txt" in caplog.text
    assert not (tmp_path / "c").exists()


def test_the_packed_top_k_is_each_id_above_its_weights_bfloat16_bits_and_one_op_when_traced():
    ids = torch.tensor([[3, 0], [7, 2]], dtype=torch.int32)
    weights = torch.tensor([[0.75, 0.25], [1.0, -0.5]])
    out = torch.empty_like(ids)
    triton_ops.pack_topk_ids_launch((1,), ids, weights, out, ids.numel(), BLOCK_SIZE=1024)
    assert torch.equal(out >> 16, ids)
    assert torch.equal((out & 0xFFFF).to(torch.int16).view(torch.bfloat16), weights.bfloat16())
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda i, w, o: triton_ops.pack_topk_ids_launch((1,), i, w, o, i.numel())
    )(ids, weights, out)
    called = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert called == ["fp4lab_triton.pack_topk_ids.default"]


def test_the_padded_rows_expert_ids_are_masked_without_reading_the_count_on_the_host():
    ids = torch.arange(8, dtype=torch.int32).view(4, 2)
    cpu_moe_kernels.mask_topk_ids(ids, torch.tensor([3]))
    assert ids.tolist() == [[0, 1], [2, 3], [4, 5], [-1, -1]]
    gm = torch.fx.experimental.proxy_tensor.make_fx(cpu_moe_kernels.mask_topk_ids)(
        torch.zeros(4, 2, dtype=torch.int32), torch.tensor([1])
    )
    called = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not called & {"aten._local_scalar_dense.default", "aten.item.default"}
