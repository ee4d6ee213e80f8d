//! A sequence's images: their embeddings once encoded, the prompt positions that may run
//! before an image is, and each step's share of an image's rows.

use std::sync::Arc;

use super::Sequence;
use crate::vision::prompt::PromptImage;

/// An image of a sequence's prompt, with its embeddings once encoded.
pub(crate) struct SequenceImage {
    /// What the request sent.
    pub(crate) image: PromptImage,
    /// Its rows of the model's width, once encoded (before the prefill reaches it).
    pub(crate) rows: Option<Arc<Vec<f32>>>,
    /// Whether its rows attend to each other both ways (then they go in one step).
    pub(crate) bidirectional: bool,
    /// The width of the grid of rotary positions its rows take, where the text model
    /// places an image's rows on one (M-RoPE).
    pub(crate) grid_columns: Option<usize>,
    /// Its encoding part way through the vision model, while it has no rows yet.
    pub(crate) encoding: Option<crate::vision::ImageEncoding>,
}

/// A step's share of one of a sequence's images: which image, where its rows start among
/// the step's tokens, and which of its rows.
pub(crate) struct ImageSlice {
    pub(crate) image: usize,
    pub(crate) at: usize,
    pub(crate) rows: std::ops::Range<usize>,
}

impl Sequence {
    /// Prompt positions that may run now: [`Self::pending_prefill`] up to the first
    /// image not yet encoded.
    pub(crate) fn ready_prefill(&self) -> usize {
        let start = self.cache.len();
        let waiting = self
            .images
            .iter()
            .filter(|i| i.rows.is_none() && i.image.span().end > start)
            .map(|i| i.image.start.saturating_sub(start))
            .min();
        waiting.map_or(self.pending_prefill(), |w| w.min(self.pending_prefill()))
    }

    /// Where a prefill chunk from `start` planned to end at `end` ends: never inside an
    /// image whose rows attend both ways (before it if the chunk reaches into it, after
    /// it if the chunk starts with it), nor past the prompt.
    pub(super) fn chunk_end(&self, start: usize, end: usize) -> usize {
        let mut end = end.min(start + self.ready_prefill());
        for image in self.images.iter().filter(|i| i.bidirectional) {
            let span = image.image.span();
            if span.start < end && end < span.end {
                end = if span.start > start {
                    span.start
                } else {
                    span.end
                };
            }
        }
        end.min(self.prompt_len)
    }

    /// The images' rows among a step's tokens, which start at position `start` and are
    /// `len` long.
    pub(crate) fn image_slices(&self, start: usize, len: usize) -> Vec<ImageSlice> {
        let end = start + len;
        self.images
            .iter()
            .enumerate()
            .filter_map(|(i, image)| {
                let span = image.image.span();
                let (lo, hi) = (span.start.max(start), span.end.min(end));
                (lo < hi).then(|| ImageSlice {
                    image: i,
                    at: lo - start,
                    rows: lo - span.start..hi - span.start,
                })
            })
            .collect()
    }
}
