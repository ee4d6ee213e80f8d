//! The engine thread's images: each running sequence's images encoded by the vision model
//! a piece at a time, between forward steps and within a step's time, so that encoding
//! a large image delays the other streams' next tokens no more than a prompt chunk does.
//! An image seen before comes from the embedding cache instead.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stats::EngineStats;
use crate::error::EngineError;
use crate::running::Sequence;
use crate::vision::{EmbeddingCache, VisionModel};

/// Bytes of embeddings kept for images seen again: Gemma 3 4B's 256 tokens of 2,560
/// floats are 2.5 MiB, so about 25 images.
pub const DEFAULT_EMBEDDING_CACHE_BYTES: usize = 64 << 20;

/// How long a piece of an image's tower work between two looks at the clock should take:
/// the piece is sized from the last one's time per row.
const PIECE_TARGET: Duration = Duration::from_millis(40);
/// Rows of the first piece, and the fewest and most of any: pieces too small re-read a
/// block's weights for too few rows and leave threads idle.
const FIRST_PIECE: usize = 64;
const PIECE_ROWS: std::ops::RangeInclusive<usize> = 32..=1024;

/// The vision model and what it has encoded.
pub(super) struct ImageEncoder {
    vision: Option<Arc<VisionModel>>,
    cache: EmbeddingCache,
    /// Rows of the next piece of tower work ([`PIECE_TARGET`]).
    piece_rows: usize,
    /// Whether the text model places images on grids of positions
    /// ([`crate::model::ModelInfo::grid_positions`]).
    grid_positions: bool,
}

impl ImageEncoder {
    pub(super) fn new(
        vision: Option<Arc<VisionModel>>,
        cache_bytes: usize,
        grid_positions: bool,
    ) -> Self {
        Self {
            vision,
            cache: EmbeddingCache::new(cache_bytes),
            piece_rows: FIRST_PIECE,
            grid_positions,
        }
    }

    /// At admission: `seq`'s images that are in the cache get their embeddings; an image
    /// without a vision model is an error.
    pub(super) fn admit(&mut self, seq: &mut Sequence) -> Result<(), EngineError> {
        if seq.images.is_empty() {
            return Ok(());
        }
        let Some(vision) = &self.vision else {
            return Err(EngineError::invalid("images", "this model reads text only"));
        };
        for image in &mut seq.images {
            image.bidirectional = vision.bidirectional();
            image.grid_columns = match self.grid_positions {
                true => vision.grid_columns(&image.image.image),
                false => None,
            };
            if image.rows.is_none() {
                image.rows = self.cache.get(&image.image.hash);
            }
        }
        Ok(())
    }

    /// Whether a running sequence has an image still to encode (one whose positions came
    /// from the prefix cache needs none).
    pub(super) fn pending(running: &[Sequence]) -> bool {
        running.iter().any(|s| {
            let done = s.cache.len();
            s.images
                .iter()
                .any(|i| i.rows.is_none() && i.image.span().end > done)
        })
    }

    /// Encodes the running sequences' images, oldest sequence first and each in prompt
    /// order, until `deadline` (one piece at least). Returns the sequences whose image
    /// failed, with the error.
    pub(super) fn advance(
        &mut self,
        running: &mut [Sequence],
        deadline: Instant,
        stats: &EngineStats,
    ) -> Vec<(usize, EngineError)> {
        let mut failed = Vec::new();
        let Some(vision) = &self.vision else {
            return failed;
        };
        let width = vision.text_hidden();
        'sequences: for (s, seq) in running.iter_mut().enumerate() {
            let done = seq.cache.len();
            let waiting = seq
                .images
                .iter_mut()
                .filter(|i| i.rows.is_none() && i.image.span().end > done);
            for image in waiting {
                if let Some(rows) = self.cache.get(&image.image.hash) {
                    image.rows = Some(rows);
                    image.encoding = None;
                    continue;
                }
                let encoding = image
                    .encoding
                    .get_or_insert_with(|| vision.start_encoding(&image.image.image));
                loop {
                    let started = Instant::now();
                    let outcome = vision.continue_encoding(encoding, self.piece_rows);
                    let per_row = started.elapsed().as_secs_f64() / self.piece_rows as f64;
                    self.piece_rows = ((PIECE_TARGET.as_secs_f64() / per_row.max(1e-9)) as usize)
                        .clamp(*PIECE_ROWS.start(), *PIECE_ROWS.end());
                    match outcome {
                        Ok(None) => {}
                        Ok(Some(rows)) => {
                            if rows.len() != image.image.tokens * width {
                                failed.push((
                                    s,
                                    EngineError::invalid(
                                        "images",
                                        format!(
                                            "the image takes {} positions but encodes to {} rows",
                                            image.image.tokens,
                                            rows.len() / width.max(1)
                                        ),
                                    ),
                                ));
                                continue 'sequences;
                            }
                            let rows = Arc::new(rows);
                            stats.images_encoded.fetch_add(1, Ordering::Relaxed);
                            self.cache.insert(image.image.hash, Arc::clone(&rows));
                            image.rows = Some(rows);
                            image.encoding = None;
                            break;
                        }
                        Err(e) => {
                            failed.push((s, e));
                            continue 'sequences;
                        }
                    }
                    if Instant::now() >= deadline {
                        return failed;
                    }
                }
                if Instant::now() >= deadline {
                    return failed;
                }
            }
        }
        failed
    }
}
