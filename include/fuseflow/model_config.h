/* fuseflow: the hyper-parameters of a Llama-family decoder (Llama 2/3, Qwen2/2.5, Mistral
 * without sliding window), read from and written to a Hugging Face config.json.
 *
 * Shapes these imply (HF tensor names, row-major [out, in]):
 *   model.embed_tokens.weight                    [vocab, hidden]
 *   model.layers.L.input_layernorm.weight        [hidden]
 *   model.layers.L.self_attn.q_proj.weight       [heads*head_dim, hidden]   (+ .bias when attention_bias)
 *   model.layers.L.self_attn.k_proj.weight       [kv_heads*head_dim, hidden] (+ .bias)
 *   model.layers.L.self_attn.v_proj.weight       [kv_heads*head_dim, hidden] (+ .bias)
 *   model.layers.L.self_attn.o_proj.weight       [hidden, heads*head_dim]
 *   model.layers.L.post_attention_layernorm.weight [hidden]
 *   model.layers.L.mlp.gate_proj.weight          [intermediate, hidden]
 *   model.layers.L.mlp.up_proj.weight            [intermediate, hidden]
 *   model.layers.L.mlp.down_proj.weight          [hidden, intermediate]
 *   model.norm.weight                            [hidden]
 *   lm_head.weight                               [vocab, hidden]  (absent when tie_word_embeddings)
 *   score.weight                                 [1, hidden]      (only when value_head: critics, reward models)
 */
#ifndef FUSEFLOW_MODEL_CONFIG_H
#define FUSEFLOW_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

#define FF_MAX_EOS 8

typedef enum { FF_ROPE_SCALING_NONE = 0, FF_ROPE_SCALING_LLAMA3 } ff_rope_scaling_kind;

typedef struct ff_model_config {
    char model_type[32];              /* "llama", "qwen2", "mistral" */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;
    int32_t num_hidden_layers;
    int32_t num_attention_heads;
    int32_t num_key_value_heads;      /* divides num_attention_heads (GQA) */
    int32_t head_dim;                 /* hidden_size / num_attention_heads unless given */
    int32_t max_position_embeddings;
    double rope_theta;
    double rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias;              /* q/k/v biases: true for Qwen2 */
    struct {
        ff_rope_scaling_kind kind;
        double factor, low_freq_factor, high_freq_factor;
        int32_t original_max_position_embeddings;
    } rope_scaling;
    bool value_head;                  /* a scalar head score.weight [1, hidden] */
    int32_t bos_token_id;             /* -1 when none */
    int32_t pad_token_id;             /* -1 when none */
    int32_t eos_token_ids[FF_MAX_EOS];
    int n_eos;
} ff_model_config;

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
