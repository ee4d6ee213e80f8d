//! A tiny GGUF writer for tests: any metadata, any tensor directory (including types and
//! shapes no real file has), so that malformed files can be built byte by byte.

/// A metadata value.
pub enum Meta {
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 8.
    Str(String),
    /// GGUF type 9 of strings.
    Strs(Vec<String>),
}

/// A GGUF file under construction (version 3).
#[derive(Default)]
pub struct GgufBytes {
    meta: Vec<(String, Meta)>,
    /// Name, dimensions (innermost first, as stored), type id, data.
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufBytes {
    /// Adds a metadata entry.
    pub fn meta(mut self, key: &str, value: Meta) -> Self {
        self.meta.push((key.into(), value));
        self
    }

    /// Adds a tensor with raw data of type id `dtype`.
    pub fn tensor(mut self, name: &str, dims: &[u64], dtype: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), dtype, data));
        self
    }

    /// The file's bytes (alignment 32).
    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.meta.len() as u64).to_le_bytes());
        for (key, value) in &self.meta {
            put_str(&mut out, key);
            match value {
                Meta::U32(v) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Meta::F32(v) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Meta::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Meta::Strs(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for s in items {
                        put_str(&mut out, s);
                    }
                }
            }
        }
        let mut offset = 0u64;
        for (name, dims, dtype, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(dtype.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            out.resize(out.len().div_ceil(32) * 32, 0);
        }
        out
    }
}

/// `n` little-endian `f32` values, small and varied.
fn f32s(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (((i * 7 % 11) as f32 - 5.0) * 0.05).to_le_bytes())
        .collect()
}

/// A complete one-layer model of `arch` (`llama` or `gemma3`) with F32 weights: width 8,
/// two query heads of dimension 4 sharing one key-value head, a feed-forward width of
/// 16, and a seven-token byte-level vocabulary. Small enough to load and run thousands
/// of times a second.
pub fn tiny_model(arch: &str) -> GgufBytes {
    let tokens: Vec<String> = ["<s>", "</s>", "a", "b", "ab", "Ġ", "Ġa"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let key = |k: &str| format!("{arch}.{k}");
    let mut g = GgufBytes::default()
        .meta("general.architecture", Meta::Str(arch.into()))
        .meta("general.name", Meta::Str("tiny".into()))
        .meta(&key("context_length"), Meta::U32(64))
        .meta(&key("embedding_length"), Meta::U32(8))
        .meta(&key("block_count"), Meta::U32(1))
        .meta(&key("feed_forward_length"), Meta::U32(16))
        .meta(&key("attention.head_count"), Meta::U32(2))
        .meta(&key("attention.head_count_kv"), Meta::U32(1))
        .meta(&key("attention.key_length"), Meta::U32(4))
        .meta(&key("rope.dimension_count"), Meta::U32(4))
        .meta(&key("attention.sliding_window"), Meta::U32(16))
        .meta(&key("rope.freq_base"), Meta::F32(10000.0))
        .meta(&key("attention.layer_norm_rms_epsilon"), Meta::F32(1e-5))
        .meta("tokenizer.ggml.model", Meta::Str("gpt2".into()))
        .meta("tokenizer.ggml.tokens", Meta::Strs(tokens))
        .meta(
            "tokenizer.ggml.merges",
            Meta::Strs(vec!["a b".into(), "Ġ a".into()]),
        )
        .meta("tokenizer.ggml.bos_token_id", Meta::U32(0))
        .meta("tokenizer.ggml.eos_token_id", Meta::U32(1))
        // GGUF lists dimensions innermost first: [cols, rows].
        .tensor("token_embd.weight", &[8, 7], 0, f32s(56))
        .tensor("output_norm.weight", &[8], 0, f32s(8))
        .tensor("blk.0.attn_norm.weight", &[8], 0, f32s(8))
        .tensor("blk.0.attn_q.weight", &[8, 8], 0, f32s(64))
        .tensor("blk.0.attn_k.weight", &[8, 4], 0, f32s(32))
        .tensor("blk.0.attn_v.weight", &[8, 4], 0, f32s(32))
        .tensor("blk.0.attn_output.weight", &[8, 8], 0, f32s(64))
        .tensor("blk.0.ffn_norm.weight", &[8], 0, f32s(8))
        .tensor("blk.0.ffn_gate.weight", &[8, 16], 0, f32s(128))
        .tensor("blk.0.ffn_up.weight", &[8, 16], 0, f32s(128))
        .tensor("blk.0.ffn_down.weight", &[16, 8], 0, f32s(128));
    if arch == "gemma3" {
        g = g
            .tensor("blk.0.attn_q_norm.weight", &[4], 0, f32s(4))
            .tensor("blk.0.attn_k_norm.weight", &[4], 0, f32s(4))
            .tensor("blk.0.post_attention_norm.weight", &[8], 0, f32s(8))
            .tensor("blk.0.post_ffw_norm.weight", &[8], 0, f32s(8));
    }
    g
}

/// The tiny llama without its layer's weights: a file every reader path can read but
/// that is not a whole model.
pub fn small_llama() -> GgufBytes {
    let mut g = tiny_model("llama");
    g.tensors
        .retain(|(name, ..)| !name.starts_with("blk.0.attn_q"));
    g
}
