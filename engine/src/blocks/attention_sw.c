/*
 * attention_sw.c -- grouped-query attention with a sliding window and attention sinks
 * (gpt_oss), over the same f32 KV cache as attention.c.
 *
 * h = x + o(attn(rmsnorm(x))) + bo: q/k/v projected with biases, RoPE (rotate_half on the
 * first rope_dim dims), then per (token, head) a causal softmax over the keys
 * max(0, p - window + 1) .. p (all keys when window is 0) plus one extra logit per head,
 * the sink, which takes probability mass but contributes no value:
 *   out = sum_j e^(s_j - M) v_j / (sum_j e^(s_j - M) + e^(sink_h - M)).
 * The cache keeps every position (the window only masks), so state save/load and the
 * memory plan are those of plain attention. The (token, head) tasks are attention.c's
 * (wpi_attention_attend_seqs, with the window and the sinks), so a batched step runs
 * every sequence's in one parallel section. Thread count never changes a result.
 */
#include "blocks.h"


void wpi_attention_sw_attend(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos,
                             uint32_t window)
{
    wpi_attention_attend_seqs(&m, l, &n, &pos, 1, window, 1);
}

void wpi_attention_sw_block(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos,
                            uint32_t window)
{
    wpi_attention_project(m, l, n);
    wpi_attention_sw_attend(m, l, n, pos, window);
    wpi_attention_output(m, l, n);
}
