//! The `gemma3` architecture: Gemma 3 text models. Differences from llama: scaled
//! embeddings, RMS-normed queries and keys, norms after attention and feed-forward too,
//! GELU (tanh) gating, NeoX rotary embeddings, and five sliding-window layers (local
//! rotary base) for every global one.

use candle_core::quantized::QTensor;
use candle_core::Tensor;

use super::attention::AttentionShape;
use super::ops::{self, Rope, RopeStyle};
use super::Dimensions;
use super::{
    attend_batch, gather_rows, split_rows, BatchEntry, Model, ModelInfo, PromptBatching, StepLayout,
};
use crate::gguf::GgufFile;
use crate::quant::QMatrix;
use crate::EngineError;

/// Every `SLIDING_WINDOW_PATTERN`-th layer attends globally; the others use the window.
const SLIDING_WINDOW_PATTERN: usize = 6;
/// Rotary base of the sliding-window layers.
const LOCAL_ROPE_THETA: f32 = 10_000.0;

struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    wo: QMatrix,
    post_attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    post_ffn_norm: Vec<f32>,
    shape: AttentionShape,
    rope: Rope,
}

/// A Gemma 3 text model.
pub struct Gemma3 {
    info: ModelInfo,
    embedding: QTensor,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: QMatrix,
    hidden: usize,
    eps: f32,
    query_scale: f32,
    batching: PromptBatching,
}

impl Gemma3 {
    /// Loads the weights and hyper-parameters from a GGUF file.
    pub fn load(gguf: &mut GgufFile) -> Result<Self, EngineError> {
        let m = gguf.meta.clone();
        let key = |k: &str| format!("gemma3.{k}");
        let hidden = m.u32(&key("embedding_length"))? as usize;
        let n_layers = m.u32(&key("block_count"))? as usize;
        let n_head = m.u32(&key("attention.head_count"))? as usize;
        let n_kv_head = m
            .u32(&key("attention.head_count_kv"))
            .map_or(n_head, |v| v as usize);
        let head_dim = m
            .u32(&key("attention.key_length"))
            .map_or(256, |v| v as usize);
        let eps = m.f32(&key("attention.layer_norm_rms_epsilon"))?;
        let theta = m.f32(&key("rope.freq_base")).unwrap_or(1_000_000.0);
        let rope_scale = m.f32(&key("rope.scaling.factor")).unwrap_or(1.0);
        let window = m
            .u32(&key("attention.sliding_window"))
            .map_or(4096, |v| v as usize);
        let context_length = m.u32(&key("context_length")).unwrap_or(32_768) as usize;
        let dims = Dimensions {
            hidden,
            n_layers,
            n_head,
            n_kv_head,
            head_dim,
            context_length,
        }
        .check(gguf)?;
        let vocab_size = dims.vocab_size(gguf)?;
        let embedding = gguf.qtensor("token_embd.weight")?;
        let global_rope = Rope::new(head_dim, theta, rope_scale, RopeStyle::Neox);
        let local_rope = Rope::new(head_dim, LOCAL_ROPE_THETA, 1.0, RopeStyle::Neox);
        let mut layers = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let p = |n: &str| format!("blk.{i}.{n}.weight");
            // The feed-forward width is whatever the gate matrix has.
            let ff = gguf.dims(&p("ffn_gate"))?.first().copied().unwrap_or(0);
            let local = (i + 1) % SLIDING_WINDOW_PATTERN != 0;
            layers.push(Layer {
                attn_norm: gguf.vector_of(&p("attn_norm"), hidden)?,
                wq: gguf.matmul_shaped(&p("attn_q"), n_head * head_dim, hidden)?,
                wk: gguf.matmul_shaped(&p("attn_k"), n_kv_head * head_dim, hidden)?,
                wv: gguf.matmul_shaped(&p("attn_v"), n_kv_head * head_dim, hidden)?,
                q_norm: gguf.vector_of(&p("attn_q_norm"), head_dim)?,
                k_norm: gguf.vector_of(&p("attn_k_norm"), head_dim)?,
                wo: gguf.matmul_shaped(&p("attn_output"), hidden, n_head * head_dim)?,
                post_attn_norm: gguf.vector_of(&p("post_attention_norm"), hidden)?,
                ffn_norm: gguf.vector_of(&p("ffn_norm"), hidden)?,
                gate: gguf.matmul_shaped(&p("ffn_gate"), ff, hidden)?,
                up: gguf.matmul_shaped(&p("ffn_up"), ff, hidden)?,
                down: gguf.matmul_shaped(&p("ffn_down"), hidden, ff)?,
                post_ffn_norm: gguf.vector_of(&p("post_ffw_norm"), hidden)?,
                shape: AttentionShape {
                    n_head,
                    n_kv_head,
                    head_dim,
                    // Queries are scaled before attention, as Gemma specifies.
                    scale: 1.0,
                    window: local.then_some(window),
                },
                rope: if local {
                    local_rope.clone()
                } else {
                    global_rope.clone()
                },
            });
        }
        let output = if gguf.has_tensor("output.weight") {
            gguf.matmul_shaped("output.weight", vocab_size, hidden)?
        } else {
            gguf.matmul("token_embd.weight")?
        };
        Ok(Self {
            info: ModelInfo {
                architecture: "gemma3".into(),
                name: m.string("general.name").ok(),
                n_layers,
                kv_width: n_kv_head * head_dim,
                vocab_size,
                context_length,
                sliding_window: true,
                rounds_by_kernel: gguf.rounds_by_kernel(),
            },
            embedding,
            layers,
            output_norm: gguf.vector_of("output_norm.weight", hidden)?,
            output,
            hidden,
            eps,
            query_scale: 1.0 / (head_dim as f32).sqrt(),
            batching: PromptBatching::default(),
        })
    }
}

impl Model for Gemma3 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn forward(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        let layout = StepLayout::new(batch, &self.batching, true);
        if layout.rows() == 0 {
            return Ok(Vec::new());
        }
        let ids = Tensor::new(StepLayout::tokens(batch), &candle_core::Device::Cpu)?;
        let mut x = self
            .embedding
            .embedding(&ids)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let embed_scale = (self.hidden as f32).sqrt();
        x.iter_mut().for_each(|v| *v *= embed_scale);
        let all = &layout.kernels;
        let mut ffn_kernels = all.clone();
        for (li, layer) in self.layers.iter().enumerate() {
            let q_width = layer.shape.n_head * layer.shape.head_dim;
            let kv_width = layer.shape.n_kv_head * layer.shape.head_dim;
            let mut h = x.clone();
            ops::rms_norm(&mut h, &layer.attn_norm, self.eps);
            let [mut q, mut k, v] = ops::matmul_many([&layer.wq, &layer.wk, &layer.wv], &h, all)?;
            ops::rms_norm(&mut q, &layer.q_norm, self.eps);
            ops::rms_norm(&mut k, &layer.k_norm, self.eps);
            for (r, &pos) in layout.positions.iter().enumerate() {
                layer
                    .rope
                    .apply(&mut q[r * q_width..(r + 1) * q_width], pos);
                layer
                    .rope
                    .apply(&mut k[r * kv_width..(r + 1) * kv_width], pos);
            }
            q.iter_mut().for_each(|v| *v *= self.query_scale);
            let attn = attend_batch(&layer.shape, li, &layout, &q, &k, &v, batch);
            let mut o = ops::matmul(&layer.wo, &attn, all)?;
            ops::rms_norm(&mut o, &layer.post_attn_norm, self.eps);
            ops::add_assign(&mut x, &o);
            if li + 1 == self.layers.len() {
                // Only the rows whose logits are wanted need the last feed-forward.
                x = gather_rows(&x, self.hidden, &layout.logit_rows);
                ffn_kernels = layout.logit_kernels.clone();
                if ffn_kernels.is_empty() {
                    break;
                }
            }
            let mut h = x.clone();
            ops::rms_norm(&mut h, &layer.ffn_norm, self.eps);
            let [mut gate, up] = ops::matmul_many([&layer.gate, &layer.up], &h, &ffn_kernels)?;
            ops::gelu_mul(&mut gate, &up);
            let mut down = ops::matmul(&layer.down, &gate, &ffn_kernels)?;
            ops::rms_norm(&mut down, &layer.post_ffn_norm, self.eps);
            ops::add_assign(&mut x, &down);
        }
        for entry in batch.iter_mut() {
            entry.cache.commit(entry.tokens.len());
        }
        if layout.logit_rows.is_empty() {
            return Ok(Vec::new());
        }
        ops::rms_norm(&mut x, &self.output_norm, self.eps);
        let logits = ops::matmul(&self.output, &x, &layout.logit_kernels)?;
        Ok(split_rows(logits, self.info.vocab_size))
    }

    fn set_prompt_batching(&mut self, batching: PromptBatching) {
        self.batching = batching;
    }

    fn prompt_batching(&self) -> PromptBatching {
        self.batching
    }
}
