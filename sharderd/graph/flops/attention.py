"""FLOPs of fused attention ops (ONNX Attention and onnxruntime's contrib attention ops).

They share one core (QKᵀ, softmax, AV); each op differs only in how its operands carry batch,
heads, sequence and head size, so each reader recovers those and calls the core.
"""

from __future__ import annotations

import onnx

from sharderd.graph.flops.operands import Shapes, has_input, int_attr, ints_attr, shape_at
from sharderd.graph.flops.unit_costs import ARITH, SOFTMAX


def _attention_core(b: int, heads: int, sq: int, skv: int, d: int, dv: int) -> float:
    """QKᵀ (2·d per score), scale + softmax per score, then AV (2·dv per score)."""
    return float(b * heads * sq * skv) * (2 * d + 2 * dv + ARITH + SOFTMAX)


def attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """ONNX Attention (opset 23): Q/K/V as 4-D [B, H, S, D] or 3-D [B, S, H·D] with head attrs."""
    q, k, v, past = shape_at(ins, 0), shape_at(ins, 1), shape_at(ins, 2), shape_at(ins, 4)
    if q is None or k is None or v is None or len(k) < 3:
        return None
    if len(q) == 4 and len(v) == 4:
        b, heads, sq, d = q
        dv = v[3]
    else:
        heads, kv_heads = int_attr(node, "q_num_heads", 0), int_attr(node, "kv_num_heads", 0)
        if len(q) != 3 or len(v) != 3 or not heads or not kv_heads:
            return None
        b, sq, d, dv = q[0], q[1], q[2] // heads, v[2] // kv_heads
    skv = k[-2] + (past[2] if past is not None and len(past) == 4 else 0)
    return _attention_core(b, heads, sq, skv, d, dv)


def ms_attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """com.microsoft Attention: the fused QKV projection [B,S,in]×[in, q+k+v], then the core."""
    x, w, past = shape_at(ins, 0), shape_at(ins, 1), shape_at(ins, 4)
    heads = int_attr(node, "num_heads", 0)
    if x is None or w is None or len(x) != 3 or len(w) != 2 or not heads:
        return None
    b, s, hidden_in = x
    sizes = ints_attr(node, "qkv_hidden_sizes") or (w[1] // 3,) * 3
    if len(sizes) != 3:
        return None
    q_size, _, v_size = sizes
    projection = 2.0 * b * s * hidden_in * w[1] + (b * s * w[1] if has_input(node, 2) else 0)
    skv = s + (past[3] if past is not None and len(past) == 5 else 0)
    return projection + _attention_core(b, heads, s, skv, q_size // heads, v_size // heads)


def ms_multi_head_attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """com.microsoft MultiHeadAttention, including packed QKV [B,S,H,3,D] and KV [B,S,H,2,D]."""
    q, k, v, past = shape_at(ins, 0), shape_at(ins, 1), shape_at(ins, 2), shape_at(ins, 6)
    heads = int_attr(node, "num_heads", 0)
    if q is None or not heads:
        return None
    if len(q) == 5:
        b, sq, _, _, d = q
        return _attention_core(b, heads, sq, sq, d, d)
    if len(q) != 3 or k is None or len(k) not in (3, 4, 5):
        return None
    b, sq, d = q[0], q[1], q[2] // heads
    if len(k) == 5:  # packed KV
        skv, dv = k[1], k[4]
    else:  # [B, S, H·D] or, for cross attention with a cache, [B, H, S, D]
        skv = k[-2]
        dv = d if v is None else v[-1] // heads if len(v) == 3 else v[-1]
    if len(k) == 3 and past is not None and len(past) == 4:
        skv += past[2]
    return _attention_core(b, heads, sq, skv, d, dv)


def ms_group_query_attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """com.microsoft GroupQueryAttention: K/V heads shared; the KV length is the present cache's."""
    q, present, past = shape_at(ins, 0), shape_at(outs, 1), shape_at(ins, 3)
    heads, kv_heads = int_attr(node, "num_heads", 0), int_attr(node, "kv_num_heads", 0)
    if q is None or len(q) != 3 or not heads or not kv_heads:
        return None
    d = q[2] // heads if has_input(node, 1) else q[2] // (heads + 2 * kv_heads)
    if present is not None and len(present) == 4:
        skv = present[2]
    else:
        skv = q[1] + (past[2] if past is not None and len(past) == 4 else 0)
    return _attention_core(q[0], heads, q[1], skv, d, d)
