//! Model architectures: one file each, sharing the kernels in [`ops`].
//!
//! A forward step takes a batch of sequences, each with some new tokens (a prefill chunk
//! or one decode token) and its own [`SequenceCache`]; all tokens of the step go through
//! the weight matrices together, attention runs per sequence against its own cache.

pub mod attention;
mod attention_parts;
mod attention_quant;
mod attention_simd;
mod attention_tiled;
mod attention_tiled_simd;
mod decoder;
mod gemma2;
mod gemma3;
pub mod hadamard;
mod llama;
pub mod ops;
mod phi3;
mod prompt_batching;
mod qwen2;
mod qwen3;

pub use prompt_batching::{PromptBatching, RowPlan};
// The tiled attention's tile, online-softmax state and step, tile sum and normalisation,
// which the vision tower's attention shares.
pub(crate) use attention_parts::{normalise, Partial};
pub(crate) use attention_tiled::{tile_sum, TILE as ATTENTION_TILE};
#[cfg(target_arch = "x86_64")]
pub(crate) use attention_tiled_simd::softmax_step;

use std::path::Path;

use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::kv_cache::{KvTypes, SequenceCache};
use crate::quant::{Embedding, RowKernel};
use crate::tokenizer::{is_image_token, TokenId};

/// What the engine needs to know about a loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// GGUF architecture name (`llama`, `qwen2`, …).
    pub architecture: String,
    /// Human-readable name from the file's metadata, if any.
    pub name: Option<String>,
    /// Number of transformer layers.
    pub n_layers: usize,
    /// Width of the embeddings (an image's rows must be as wide).
    pub hidden: usize,
    /// Floats per position per layer in the KV cache.
    pub kv_width: usize,
    /// Vocabulary size (width of a logits row).
    pub vocab_size: usize,
    /// Longest context the model was trained for.
    pub context_length: usize,
    /// Whether some layers attend within a sliding window (llama-server then ends a
    /// prompt's batch before its last tokens; see [`PromptBatching`]).
    pub sliding_window: bool,
    /// Whether a prompt row's result depends on how the prompt is batched (its matrices
    /// round GEMV and GEMM rows differently).
    pub rounds_by_kernel: bool,
    /// Whether its rotary positions have sections (M-RoPE, Qwen2-VL's text model): an
    /// image whose projector lays it on a grid then takes 2-D positions ([`ImageGrid`]),
    /// as llama.cpp's `mtmd` places images for such a model only.
    pub grid_positions: bool,
}

/// One sequence's share of a forward step.
pub struct BatchEntry<'a> {
    /// New tokens, at positions `cache.len()..cache.len() + tokens.len()`.
    pub tokens: &'a [TokenId],
    /// The sequence's cache; the step appends the new tokens' keys and values.
    pub cache: &'a mut SequenceCache,
    /// Which of the new tokens' logits to return.
    pub logits: Logits,
    /// Length of the sequence's prompt: tokens at earlier positions are prompt tokens,
    /// the others were generated (this decides how their rows are rounded).
    pub prompt_len: usize,
    /// Rows that stand in for some of the new tokens' embeddings: the images among them
    /// (whose tokens are placeholders, [`crate::vision::prompt`]).
    pub images: Vec<StepImage<'a>>,
    /// Every image of the sequence that lies on a grid of rotary positions (M-RoPE,
    /// Qwen2-VL's text model), in prompt order; empty for other models. Its rows' and
    /// every later position's rotations depend on it ([`rope_position`]).
    pub grids: Vec<ImageGrid>,
}

/// An image whose rows take two-dimensional rotary positions (M-RoPE): row `i` of a
/// `columns`-wide grid sits at `(t, t + i / columns, t + i % columns, 0)`, `t` the
/// position the image starts at, and the text after it starts `max(columns, rows)` on,
/// as llama.cpp's `mtmd` places Qwen2-VL's images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageGrid {
    /// The image's positions in the sequence (its cache cells).
    pub span: std::ops::Range<usize>,
    /// Rows of the grid are this wide.
    pub columns: usize,
}

impl ImageGrid {
    fn rows(&self) -> usize {
        self.span.len().div_ceil(self.columns.max(1))
    }

    /// How many fewer rotary positions than cells the image takes.
    fn saved(&self) -> usize {
        self.span.len() - self.columns.max(self.rows())
    }
}

/// The rotary position (time, height, width, extra) of cell `cell` of a sequence whose
/// images on a grid are `grids`: `(p, p, p, 0)` for text, `p` the cell less what the
/// images before it saved.
pub fn rope_position(grids: &[ImageGrid], cell: usize) -> [usize; 4] {
    let mut saved = 0;
    for grid in grids {
        if cell < grid.span.start {
            break;
        }
        if grid.span.contains(&cell) {
            let t = grid.span.start - saved;
            let i = cell - grid.span.start;
            let columns = grid.columns.max(1);
            return [t, t + i / columns, t + i % columns, 0];
        }
        saved += grid.saved();
    }
    let p = cell - saved;
    [p, p, p, 0]
}

/// An image's rows in a step: embeddings its projector made, read as they are (not
/// scaled as token embeddings are), in place of placeholder tokens.
#[derive(Debug, Clone)]
pub struct StepImage<'a> {
    /// Index among the entry's new tokens of the first row.
    pub at: usize,
    /// The rows, each the model's width.
    pub rows: &'a [f32],
    /// With `Some(span)`, the absolute positions of the whole image, whose rows attend to
    /// each other in both directions (Gemma 3's images, llama.cpp's non-causal decode of
    /// an image); the span's rows are then all in this step.
    pub bidirectional: Option<std::ops::Range<usize>>,
}

/// Which logits rows a batch entry wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk before the end of the prompt).
    None,
    /// The last new token's (to sample the next token).
    Last,
    /// Every new token's (prompt logprobs, draft verification).
    All,
}

/// A loaded model that can run batched forward steps.
pub trait Model: Send + Sync {
    /// Facts about the model.
    fn info(&self) -> &ModelInfo;

    /// Runs the batch's new tokens through the model, appends their keys and values to
    /// each entry's cache, and returns the logits rows the entries asked for, in batch
    /// order (an entry's rows in position order).
    fn forward(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>, EngineError>;

    /// Rounds prompt rows as llama-server does with these batching parameters (the
    /// default is its default); see [`PromptBatching`].
    fn set_prompt_batching(&mut self, batching: PromptBatching);

    /// The batching parameters prompt rows are rounded by.
    fn prompt_batching(&self) -> PromptBatching;

    /// Tells the model the longest context it will be run with (Phi-3's rotary embeddings
    /// depend on it, as llama.cpp's do on its per-sequence context). The default ignores it.
    fn set_context_length(&mut self, _context: usize) {}

    /// How many of the first `common` positions of a cache computed for a sequence whose
    /// prompt had `old_prompt_len` tokens a new sequence with `new_prompt_len` prompt
    /// tokens can reuse and get exactly the keys and values it would compute itself: those
    /// whose rows went through the same attention (and, where rows round by kernel, matrix)
    /// kernels.
    fn reusable_prefix(
        &self,
        old_prompt_len: usize,
        new_prompt_len: usize,
        common: usize,
    ) -> usize {
        let info = self.info();
        let batching = self.prompt_batching();
        let old = batching.plan(old_prompt_len, info.sliding_window, 0..common);
        let new = batching.plan(new_prompt_len, info.sliding_window, 0..common);
        old.iter()
            .zip(&new)
            .take_while(|(a, b)| {
                a.attention == b.attention && (!info.rounds_by_kernel || a.matmul == b.matmul)
            })
            .count()
    }

    /// Stores keys and values in `types` in the caches made from now on (llama.cpp's
    /// `--cache-type-k` / `--cache-type-v`); an error when a quantized type cannot hold
    /// this model's heads (their size must be a multiple of 32, as llama.cpp requires).
    fn set_kv_types(&mut self, types: KvTypes) -> Result<(), EngineError>;

    /// The types new caches store keys and values in.
    fn kv_types(&self) -> KvTypes;

    /// An empty cache sized for this model with room for `capacity` positions.
    fn new_cache(&self, capacity: usize) -> SequenceCache {
        let info = self.info();
        SequenceCache::with_types(info.n_layers, info.kv_width, capacity, self.kv_types())
    }
}

/// The hyper-parameters every architecture reads, checked for sense before anything is
/// sized by them.
#[derive(Debug, Clone, Copy)]
struct Dimensions {
    hidden: usize,
    n_layers: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    context_length: usize,
}

impl Dimensions {
    /// An error naming the first hyper-parameter out of range.
    fn check(self, gguf: &GgufFile) -> Result<Self, EngineError> {
        let limits = [
            ("embedding_length", self.hidden, 1 << 16),
            ("block_count", self.n_layers, 1024),
            ("attention.head_count", self.n_head, 1024),
            ("attention.head_count_kv", self.n_kv_head, 1024),
            ("head dimension", self.head_dim, 1024),
            ("context_length", self.context_length, 1 << 24),
        ];
        for (what, value, max) in limits {
            if value == 0 || value > max {
                return Err(EngineError::InvalidModel(format!(
                    "{}: {what} is {value}, outside 1..={max}",
                    gguf.path().display()
                )));
            }
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) || !self.head_dim.is_multiple_of(2) {
            return Err(EngineError::InvalidModel(format!(
                "{}: {} query heads cannot share {} key-value heads of dimension {}",
                gguf.path().display(),
                self.n_head,
                self.n_kv_head,
                self.head_dim
            )));
        }
        Ok(self)
    }

    /// The token embedding's row count (the vocabulary), after checking its width.
    fn vocab_size(self, gguf: &GgufFile) -> Result<usize, EngineError> {
        let dims = gguf.dims("token_embd.weight")?;
        match dims[..] {
            [vocab, width] if width == self.hidden && vocab > 0 => Ok(vocab),
            _ => Err(EngineError::InvalidModel(format!(
                "{}: tensor `token_embd.weight` is {dims:?}, but the metadata implies [vocabulary, {}]",
                gguf.path().display(),
                self.hidden
            ))),
        }
    }
}

/// Loads the model in a GGUF file, choosing the architecture from its metadata.
pub fn load(gguf: &mut GgufFile) -> Result<Box<dyn Model>, EngineError> {
    let arch = gguf.meta.string("general.architecture")?;
    match arch.as_str() {
        "llama" => Ok(Box::new(llama::load(gguf)?)),
        "gemma3" => Ok(Box::new(gemma3::load(gguf)?)),
        "qwen2" => Ok(Box::new(qwen2::load(gguf, "qwen2")?)),
        "qwen2vl" => Ok(Box::new(qwen2::load(gguf, "qwen2vl")?)),
        "qwen3" => Ok(Box::new(qwen3::load(gguf)?)),
        "phi3" => Ok(Box::new(phi3::load(gguf)?)),
        "gemma2" => Ok(Box::new(gemma2::load(gguf)?)),
        other => Err(EngineError::Unsupported(format!(
            "model architecture `{other}` in {} (supported: llama, qwen2, qwen2vl, qwen3, phi3, gemma2, gemma3)",
            gguf.path().display()
        ))),
    }
}

/// Opens a GGUF file and loads its model.
pub fn load_path(path: &Path) -> Result<(GgufFile, Box<dyn Model>), EngineError> {
    let mut gguf = GgufFile::open(path)?;
    let model = load(&mut gguf)?;
    Ok((gguf, model))
}

/// Bookkeeping shared by the architectures for one forward step.
struct StepLayout {
    /// Absolute position of every row (token) of the step.
    positions: Vec<usize>,
    /// Rotary position of every row ([`rope_position`]).
    rope_positions: Vec<[usize; 4]>,
    /// Row ranges of each entry.
    spans: Vec<std::ops::Range<usize>>,
    /// Rows whose logits are wanted.
    logit_rows: Vec<usize>,
    /// The kernel each row's matrix products follow.
    kernels: Vec<RowKernel>,
    /// The attention kernel each row follows.
    attention: Vec<attention::AttentionKernel>,
    /// The kernel of each logit row in the last layer's feed-forward, which runs on those
    /// rows only: alone for a last-token row (llama.cpp picks the output rows out first),
    /// as in the other layers when an entry wants every row.
    logit_kernels: Vec<RowKernel>,
    /// Each entry's positions whose rows attend both ways ([`StepImage::bidirectional`]).
    bidirectional: Vec<Vec<std::ops::Range<usize>>>,
}

impl StepLayout {
    /// The layout of `batch`, for a model with sliding-window layers or not.
    fn new(batch: &[BatchEntry<'_>], batching: &PromptBatching, sliding_window: bool) -> Self {
        let mut positions = Vec::new();
        let mut rope_positions = Vec::new();
        let mut spans = Vec::with_capacity(batch.len());
        let mut logit_rows = Vec::new();
        let mut kernels = Vec::new();
        let mut attention = Vec::new();
        let mut logit_kernels = Vec::new();
        let mut bidirectional = Vec::with_capacity(batch.len());
        for entry in batch {
            bidirectional.push(
                entry
                    .images
                    .iter()
                    .filter_map(|image| image.bidirectional.clone())
                    .collect(),
            );
            let start = positions.len();
            let new = entry.cache.len()..entry.cache.len() + entry.tokens.len();
            for plan in batching.plan(entry.prompt_len, sliding_window, new.clone()) {
                kernels.push(plan.matmul);
                attention.push(plan.attention);
            }
            rope_positions.extend(new.clone().map(|p| rope_position(&entry.grids, p)));
            positions.extend(new);
            spans.push(start..positions.len());
            match entry.logits {
                Logits::None => {}
                Logits::Last if entry.tokens.is_empty() => {}
                Logits::Last => {
                    logit_rows.push(positions.len() - 1);
                    logit_kernels.push(RowKernel::Gemv);
                }
                Logits::All => {
                    logit_rows.extend(start..positions.len());
                    logit_kernels.extend_from_slice(&kernels[start..]);
                }
            }
        }
        Self {
            positions,
            rope_positions,
            spans,
            logit_rows,
            kernels,
            attention,
            logit_kernels,
            bidirectional,
        }
    }

    fn rows(&self) -> usize {
        self.positions.len()
    }

    /// The step's tokens, an image's placeholders as token 0 (their rows are replaced).
    fn tokens(batch: &[BatchEntry<'_>]) -> Vec<u32> {
        batch
            .iter()
            .flat_map(|e| e.tokens.iter().copied())
            .map(|t| if is_image_token(t) { 0 } else { t })
            .collect()
    }

    /// The step's input rows: the tokens' embeddings times `scale`, an image's rows as
    /// they are.
    fn input_rows(
        &self,
        batch: &[BatchEntry<'_>],
        embedding: &Embedding,
        scale: f32,
        hidden: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let mut x = embedding.rows(&Self::tokens(batch))?;
        if scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        for (entry, span) in batch.iter().zip(&self.spans) {
            for image in &entry.images {
                let at = (span.start + image.at) * hidden;
                x[at..at + image.rows.len()].copy_from_slice(image.rows);
            }
        }
        Ok(x)
    }
}

/// Writes each entry's new keys and values to its cache at `layer`, then attends for all
/// entries in one parallel pass. `q`, `k`, `v` hold the step's rows in batch order. With a
/// quantized cache they are rotated first, and the output rotated back, as llama.cpp does
/// ([`hadamard`]).
fn attend_batch(
    shape: &attention::AttentionShape,
    layer: usize,
    layout: &StepLayout,
    [mut q, mut k, mut v]: [Vec<f32>; 3],
    batch: &mut [BatchEntry<'_>],
) -> Vec<f32> {
    let types = batch.first().map_or(KvTypes::F16, |e| e.cache.types());
    debug_assert!(batch.iter().all(|e| e.cache.types() == types));
    let rotation = hadamard::Rotation::for_cache(types, shape.head_dim);
    if let Some(n) = rotation.keys {
        hadamard::rotate(&mut q, n);
        hadamard::rotate(&mut k, n);
    }
    if let Some(n) = rotation.values {
        hadamard::rotate(&mut v, n);
    }
    let mut out = attend_written(shape, layer, layout, &q, &k, &v, batch);
    if let Some(n) = rotation.values {
        hadamard::rotate(&mut out, n);
    }
    out
}

/// [`attend_batch`] once the rows are as the cache takes them.
fn attend_written(
    shape: &attention::AttentionShape,
    layer: usize,
    layout: &StepLayout,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    batch: &mut [BatchEntry<'_>],
) -> Vec<f32> {
    let q_width = shape.n_head * shape.head_dim;
    let kv_width = shape.n_kv_head * shape.head_dim;
    for (entry, span) in batch.iter_mut().zip(&layout.spans) {
        let rows = span.start * kv_width..span.end * kv_width;
        entry.cache.write(layer, &k[rows.clone()], &v[rows]);
    }
    let inputs: Vec<attention::AttentionInput<'_>> = batch
        .iter()
        .zip(&layout.spans)
        .zip(&layout.bidirectional)
        .map(|((entry, span), bidirectional)| attention::AttentionInput {
            q: &q[span.start * q_width..span.end * q_width],
            kv: entry.cache.layer(layer, entry.cache.len() + span.len()),
            n: span.len(),
            kernels: &layout.attention[span.clone()],
            bidirectional,
        })
        .collect();
    attention::attend_many(shape, &inputs)
}

/// Copies the rows of `x` (each `width` wide) listed in `rows`.
fn gather_rows(x: &[f32], width: usize, rows: &[usize]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| x[r * width..(r + 1) * width].iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image of 12 cells on a grid 4 wide (3 rows) at cells 3..15: its cells at
    /// `(3, 3 + row, 3 + column, 0)`, the text after it from 3 + max(4, 3) = 7 on.
    #[test]
    fn an_image_on_a_grid_takes_its_rows_and_columns_and_the_longer_side() {
        let grids = [ImageGrid {
            span: 3..15,
            columns: 4,
        }];
        assert_eq!(rope_position(&grids, 2), [2, 2, 2, 0]);
        assert_eq!(rope_position(&grids, 3), [3, 3, 3, 0]);
        assert_eq!(rope_position(&grids, 8), [3, 4, 4, 0]);
        assert_eq!(rope_position(&grids, 14), [3, 5, 6, 0]);
        assert_eq!(rope_position(&grids, 15), [7, 7, 7, 0]);
        // A second image starts where the text before it ends.
        let two = [
            grids[0].clone(),
            ImageGrid {
                span: 16..18,
                columns: 1,
            },
        ];
        assert_eq!(rope_position(&two, 17), [8, 9, 8, 0]);
        assert_eq!(rope_position(&two, 18), [10, 10, 10, 0]);
        assert_eq!(rope_position(&[], 18), [18, 18, 18, 0]);
    }
}
