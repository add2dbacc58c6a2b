"""SGLang's FlashInfer call sequence (python/sglang/srt/layers/attention/flashinfer_backend.py),
replayed unchanged on CPU tensors against the fp64 reference: one shared workspace; a ragged
and a paged prefill wrapper and a decode wrapper; a token pool with page_size 1 (k and v
buffers [slots, H_kv, D], passed as a 3-D (k, v) tuple) and kv_last_page_len all ones;
begin_forward per step (and the decode wrapper's begin_forward replaced by
partial(fast_decode_plan, wrapper), SGLang's CUDA-graph path, with global_override_indptr_cpu);
forward / forward_return_lse per layer with the layer's sm_scale and logit cap; the extend
path's merge_state of a ragged (the new tokens, causal) and a paged (the cached prefix) result.

SGLang creates the paged and decode wrappers with backend="fa2": on a machine without a CUDA
device kvattn refuses that backend by name (tested below), and backend="auto" serves the very
same calls (the replay)."""

import functools
import math

import numpy as np
import pytest
import torch

import kvattn
from reference import attention, check_close, f64

H_QO, H_KV, D = 8, 2, 64
LAYERS = [  # (sm_scale, logit_cap) per layer: a model's own scaling, and a soft-capped layer
    (1 / math.sqrt(D), 0.0),
    (0.11, 30.0),
]


class TokenPool:
    """SGLang's MHATokenToKVPool: per layer k/v buffers [size, H_kv, D]; slot 0 is padding."""

    def __init__(self, size, kv_dtype):
        self.k = [torch.zeros(size, H_KV, D, dtype=kv_dtype) for _ in LAYERS]
        self.v = [torch.zeros(size, H_KV, D, dtype=kv_dtype) for _ in LAYERS]
        self.free = list(range(1, size))

    def alloc(self, n):
        out, self.free = self.free[:n], self.free[n:]
        return torch.tensor(out, dtype=torch.int64)

    def set_kv_buffer(self, layer, loc, k, v):
        self.k[layer][loc] = k.to(self.k[layer].dtype)
        self.v[layer][loc] = v.to(self.v[layer].dtype)

    def get_kv_buffer(self, layer):
        return self.k[layer], self.v[layer]


class Backend:
    """The calls FlashInferAttnBackend makes, in its order, with its arguments."""

    def __init__(self, backend, kv_dtype, q_dtype, max_bs=32, cuda_graph_decode=False):
        self.workspace = torch.empty(128 << 20, dtype=torch.uint8)  # one shared workspace
        self.kv_dtype, self.q_dtype = kv_dtype, q_dtype
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32)
        self.ragged = kvattn.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD",
                                                                  backend="auto")
        self.paged = kvattn.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                backend=backend)
        self.decode = kvattn.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                backend=backend,
                                                                use_tensor_cores=True)
        self.cuda_graph_decode = cuda_graph_decode
        if cuda_graph_decode:
            self.decode.begin_forward = functools.partial(kvattn.fast_decode_plan, self.decode)

    def kv_indices(self, req_to_token, lens, extra=256):
        """create_flashinfer_kv_indices_triton: the slots of each request, into a buffer longer
        than needed (SGLang allocates sum + 256)."""
        out = torch.zeros(int(sum(lens)) + extra, dtype=torch.int32)
        at = 0
        for slots, n in zip(req_to_token, lens):
            out[at:at + n] = slots[:n].to(torch.int32)
            at += n
        return out

    def init_decode(self, req_to_token, seq_lens):
        bs = len(seq_lens)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        self.kv_indptr[1:bs + 1] = torch.cumsum(lens, 0)
        kv_indptr = self.kv_indptr[:bs + 1]
        kv_indices = self.kv_indices(req_to_token, seq_lens)
        kwargs = dict(data_type=self.kv_dtype, q_data_type=self.q_dtype, non_blocking=True,
                      fixed_split_size=None, disable_split_kv=False)
        if self.cuda_graph_decode:
            override = torch.zeros_like(kv_indptr)
            override[1:] = torch.cumsum(lens, 0)
            kwargs["global_override_indptr_cpu"] = override
        self.decode.begin_forward(kv_indptr, kv_indices, self.kv_last_page_len[:bs], H_QO, H_KV,
                                  D, 1, **kwargs)

    def init_extend(self, req_to_token, seq_lens, prefix_lens, use_ragged):
        bs = len(seq_lens)
        paged_lens = prefix_lens if use_ragged else seq_lens
        self.kv_indptr[1:bs + 1] = torch.cumsum(torch.tensor(paged_lens, dtype=torch.int32), 0)
        kv_indptr = self.kv_indptr[:bs + 1]
        kv_indices = self.kv_indices(req_to_token, paged_lens)
        ext = torch.tensor(seq_lens, dtype=torch.int32) - torch.tensor(prefix_lens,
                                                                       dtype=torch.int32)
        self.qo_indptr[1:bs + 1] = torch.cumsum(ext, 0)
        qo_indptr = self.qo_indptr[:bs + 1]
        if use_ragged:
            self.ragged.begin_forward(qo_indptr, qo_indptr, H_QO, H_KV, D,
                                      q_data_type=self.q_dtype)
        self.paged.begin_forward(qo_indptr, kv_indptr, kv_indices, self.kv_last_page_len[:bs],
                                 H_QO, H_KV, D, 1, q_data_type=self.q_dtype,
                                 kv_data_type=self.kv_dtype, custom_mask=None,
                                 non_blocking=True, fixed_split_size=None, prefix_len_ptr=None,
                                 token_pos_in_items_ptr=None, token_pos_in_items_len=0,
                                 max_item_len_ptr=None)
        self.use_ragged = use_ragged
        self.extend_no_prefix = not any(prefix_lens)

    def forward_extend(self, pool, layer, q, k, v, loc):
        sm_scale, cap = LAYERS[layer]
        if not self.use_ragged:
            pool.set_kv_buffer(layer, loc, k, v)
            return self.paged.forward(q.view(-1, H_QO, D), pool.get_kv_buffer(layer),
                                      causal=True, sm_scale=sm_scale, window_left=-1,
                                      logits_soft_cap=cap, k_scale=None, v_scale=None)
        if self.extend_no_prefix:
            o = self.ragged.forward(q.view(-1, H_QO, D), k.view(-1, H_KV, D),
                                    v.view(-1, H_KV, D), causal=True, sm_scale=sm_scale,
                                    logits_soft_cap=cap)
        else:
            o1, s1 = self.ragged.forward_return_lse(q.view(-1, H_QO, D), k.view(-1, H_KV, D),
                                                    v.view(-1, H_KV, D), causal=True,
                                                    sm_scale=sm_scale, window_left=-1,
                                                    logits_soft_cap=cap)
            o2, s2 = self.paged.forward_return_lse(q.view(-1, H_QO, D),
                                                   pool.get_kv_buffer(layer), causal=False,
                                                   sm_scale=sm_scale, window_left=-1,
                                                   logits_soft_cap=cap)
            o, _ = kvattn.merge_state(o1, s1, o2, s2)
        pool.set_kv_buffer(layer, loc, k, v)
        return o

    def forward_decode(self, pool, layer, q, k, v, loc):
        sm_scale, cap = LAYERS[layer]
        pool.set_kv_buffer(layer, loc, k, v)
        return self.decode.forward(q.contiguous().view(-1, H_QO, D), pool.get_kv_buffer(layer),
                                   sm_scale=sm_scale, logits_soft_cap=cap, k_scale=None,
                                   v_scale=None)


def reference(pool, layer, q, slots, k_new=None, v_new=None):
    """q [n_new, H, D] of one request over its tokens, causal (bottom-right): the cached ones
    from the pool (slots), then k_new / v_new as the ragged wrapper reads them (unquantized),
    or all from the pool when k_new is None (the paged and decode paths read the pool)."""
    sm_scale, cap = LAYERS[layer]
    k = f64(pool.k[layer][slots])
    v = f64(pool.v[layer][slots])
    if k_new is not None:
        k, v = np.concatenate([k, f64(k_new)]), np.concatenate([v, f64(v_new)])
    return attention(f64(q), k, v, causal=True, sm_scale=sm_scale, soft_cap=cap)[0]


def run_sequence(backend_name, kv_dtype, q_dtype, cuda_graph_decode, use_ragged=True):
    torch.manual_seed(7)
    pool = TokenPool(4096, kv_dtype)
    be = Backend(backend_name, kv_dtype, q_dtype, cuda_graph_decode=cuda_graph_decode)
    # A batch of mixed lengths: a long prompt, a one-token prompt, a medium one.
    prompt_lens = [37, 1, 12]
    req_to_token = [pool.alloc(600) for _ in prompt_lens]  # req_to_token rows, reserved slots
    seq = [0] * len(prompt_lens)

    def step(new_lens, mode):
        prefix = list(seq)
        total = [p + n for p, n in zip(prefix, new_lens)]
        loc = torch.cat([req_to_token[b][prefix[b]:total[b]] for b in range(len(seq))])
        if mode == "decode":
            be.init_decode(req_to_token, total)
        else:
            be.init_extend(req_to_token, total, prefix, use_ragged)
        for layer in range(len(LAYERS)):
            n = sum(new_lens)
            q = (torch.randn(n, H_QO * D)).to(q_dtype)
            k = torch.randn(n, H_KV, D).to(q_dtype)
            v = torch.randn(n, H_KV, D).to(q_dtype)
            fwd = be.forward_decode if mode == "decode" else be.forward_extend
            o = fwd(pool, layer, q, k, v, loc).view(n, H_QO, D)
            at = 0
            ragged = mode == "extend" and use_ragged
            for b, m in enumerate(new_lens):
                qb = q.view(n, H_QO, D)[at:at + m]
                if ragged:
                    ref = reference(pool, layer, qb, req_to_token[b][:prefix[b]],
                                    k[at:at + m], v[at:at + m])
                else:
                    ref = reference(pool, layer, qb, req_to_token[b][:total[b]])
                check_close(o[at:at + m], ref, q_dtype,
                            f"{mode} layer {layer} request {b}",
                            inputs_eps=2.0 ** -8 if kv_dtype != q_dtype else 0.0)
                at += m
        seq[:] = total

    step(prompt_lens, "extend")   # extend without prefix (ragged only)
    step([1, 1, 1], "decode")     # decode steps
    step([1, 1, 1], "decode")
    step([5, 9, 1], "extend")     # extend with a cached prefix: ragged + paged, merged
    step([1, 1, 1], "decode")


@pytest.mark.parametrize("cuda_graph_decode", [False, True])
def test_sglang_sequence_bf16(cuda_graph_decode):
    run_sequence("auto", torch.bfloat16, torch.bfloat16, cuda_graph_decode)


def test_sglang_sequence_paged_only_extend():
    # SGLANG_FLASHINFER_USE_PAGED: the extend runs on the paged wrapper alone (K/V saved first)
    run_sequence("auto", torch.bfloat16, torch.bfloat16, False, use_ragged=False)


def test_sglang_sequence_fp8_kv_cache():
    # kv_cache_dtype fp8: begin_forward(data_type=float8_e4m3fn, q_data_type=bfloat16)
    run_sequence("auto", torch.float8_e4m3fn, torch.bfloat16, True)


def test_fa2_on_cpu_tensors_is_refused_by_name():
    # CPU tensors: fa2 (a CUDA backend) cannot run them on any machine; the error says so.
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    w = kvattn.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    indptr = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(kvattn.Error, match="fa2"):
        w.begin_forward(indptr, torch.arange(3, dtype=torch.int32),
                        torch.ones(1, dtype=torch.int32), H_QO, H_KV, D, 1,
                        data_type=torch.bfloat16, q_data_type=torch.bfloat16)
