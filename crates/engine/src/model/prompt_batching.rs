//! Which of llama.cpp's matrix and attention kernels each prompt row goes through when
//! llama-server evaluates a prompt, so that ferrite rounds every row as it does (see
//! [`RowKernel`] and [`AttentionKernel`]).
//!
//! llama-server cuts a prompt into batches of at most `n_batch` tokens; for models with
//! sliding-window attention, whose cache it checkpoints, it also ends a batch `4 + n_ubatch`
//! and `4` tokens before the end of the prompt. llama.cpp splits each batch into
//! micro-batches of `n_ubatch` tokens, and its repacked Q4_K kernels multiply the rows of a
//! micro-batch four at a time, the last (fewer than four) one at a time. Its flash
//! attention tiles a micro-batch of 64 rows or more, and splits a lone row's keys between
//! its threads once they fill 512 cells. Tokens generated after the prompt are decoded one
//! at a time.
//!
//! The choice is a function of the prompt's length and the row's position only, never of
//! how ferrite's scheduler happens to split the prompt or what else is in the batch.

use std::ops::Range;

use super::attention::AttentionKernel;
use crate::quant::RowKernel;

/// Tokens from the end of the prompt at which llama-server ends a batch to checkpoint a
/// sliding-window cache: `n_ubatch` plus this, and this.
const CHECKPOINT_TAIL: usize = 4;

/// The kernels one row goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPlan {
    /// Its matrix products'.
    pub matmul: RowKernel,
    /// Its attention's.
    pub attention: AttentionKernel,
}

/// llama-server's prompt batching parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptBatching {
    /// Most tokens of a batch (`--batch-size`).
    pub n_batch: usize,
    /// Most tokens of a micro-batch (`--ubatch-size`).
    pub n_ubatch: usize,
}

impl Default for PromptBatching {
    /// llama-server's defaults: `-b 2048 -ub 512`.
    fn default() -> Self {
        Self {
            n_batch: 2048,
            n_ubatch: 512,
        }
    }
}

impl PromptBatching {
    /// One token at a time (llama-server's `-ub 1`): every row alone.
    pub const TOKEN_BY_TOKEN: Self = Self {
        n_batch: 2048,
        n_ubatch: 1,
    };

    /// The kernels of each row at `positions` of a sequence whose prompt has `prompt_len`
    /// tokens; `checkpoints` is whether the model has sliding-window layers. A generated
    /// token is a micro-batch of its own.
    pub fn plan(
        &self,
        prompt_len: usize,
        checkpoints: bool,
        positions: Range<usize>,
    ) -> Vec<RowPlan> {
        let micro = if positions.start < prompt_len {
            self.micro_batches(prompt_len, checkpoints)
        } else {
            Vec::new()
        };
        positions
            .map(|pos| {
                let Some(ub) = micro.iter().find(|ub| ub.contains(&pos)) else {
                    return RowPlan {
                        matmul: RowKernel::Gemv,
                        attention: AttentionKernel::for_micro_batch(1, pos),
                    };
                };
                let grouped_end = ub.end - ub.len() % 4;
                let wide = ub.len() >= RowKernel::WIDE_BATCH;
                RowPlan {
                    matmul: match (pos < grouped_end, wide) {
                        (true, true) => RowKernel::Gemm4InWideBatch,
                        (true, false) => RowKernel::Gemm4,
                        (false, true) => RowKernel::GemvInWideBatch,
                        (false, false) if ub.len() >= 2 => RowKernel::GemvInBatch,
                        (false, false) => RowKernel::Gemv,
                    },
                    attention: AttentionKernel::for_micro_batch(ub.len(), pos),
                }
            })
            .collect()
    }

    /// The matrix kernel of each row at `positions` (see [`Self::plan`]).
    pub fn kernels(
        &self,
        prompt_len: usize,
        checkpoints: bool,
        positions: Range<usize>,
    ) -> Vec<RowKernel> {
        let plan = self.plan(prompt_len, checkpoints, positions);
        plan.iter().map(|p| p.matmul).collect()
    }

    /// The attention kernel of each row at `positions` (see [`Self::plan`]).
    pub fn attention_kernels(
        &self,
        prompt_len: usize,
        checkpoints: bool,
        positions: Range<usize>,
    ) -> Vec<AttentionKernel> {
        let plan = self.plan(prompt_len, checkpoints, positions);
        plan.iter().map(|p| p.attention).collect()
    }

    /// The micro-batches llama-server evaluates a prompt of `prompt_len` tokens in.
    fn micro_batches(&self, prompt_len: usize, checkpoints: bool) -> Vec<Range<usize>> {
        let n_batch = self.n_batch.max(1);
        let n_ubatch = self.n_ubatch.clamp(1, n_batch);
        let ends_batch = |end: usize, start: usize| {
            end == prompt_len
                || end - start == n_batch
                || (checkpoints
                    && [n_ubatch + CHECKPOINT_TAIL, CHECKPOINT_TAIL]
                        .iter()
                        .any(|&tail| prompt_len == end + tail.min(n_batch)))
        };
        let mut out = Vec::new();
        let mut start = 0;
        while start < prompt_len {
            let mut end = start + 1;
            while !ends_batch(end, start) {
                end += 1;
            }
            let mut ub = start;
            while ub < end {
                let ub_end = (ub + n_ubatch).min(end);
                out.push(ub..ub_end);
                ub = ub_end;
            }
            start = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RowKernel::{
        Gemm4 as M, Gemm4InWideBatch as WM, Gemv as V, GemvInBatch as B, GemvInWideBatch as WB,
    };

    #[test]
    fn without_checkpoints_rows_go_four_at_a_time_from_the_start() {
        let b = PromptBatching::default();
        assert_eq!(b.kernels(6, false, 0..6), [M, M, M, M, B, B]);
        assert_eq!(b.kernels(3, false, 0..3), [B, B, B]);
        assert_eq!(b.kernels(1, false, 0..1), [V]);
        // Generated tokens are decoded alone.
        assert_eq!(b.kernels(6, false, 6..7), [V]);
    }

    #[test]
    fn checkpoints_cut_the_last_four_tokens_off() {
        let b = PromptBatching::default();
        assert_eq!(b.kernels(6, true, 0..6), [B, B, M, M, M, M]);
        assert_eq!(b.kernels(9, true, 0..9), [M, M, M, M, B, M, M, M, M]);
        // 14 + 4: the first micro-batch is wide, the last one is not.
        let k = b.kernels(18, true, 0..18);
        assert_eq!(
            k[..14],
            [WM, WM, WM, WM, WM, WM, WM, WM, WM, WM, WM, WM, WB, WB]
        );
        assert_eq!(k[14..], [M, M, M, M]);
        // A micro-batch of one row is a lone row.
        assert_eq!(b.kernels(5, true, 0..5), [V, M, M, M, M]);
        assert_eq!(b.micro_batches(4, true), vec![0..4]);
        assert_eq!(b.micro_batches(5, true), [0..1, 1..5]);
    }

    #[test]
    fn long_prompts_follow_batches_and_micro_batches() {
        let b = PromptBatching::default();
        assert_eq!(
            b.micro_batches(1200, true),
            [0..512, 512..684, 684..1196, 1196..1200]
        );
        assert_eq!(
            b.micro_batches(5000, false),
            [
                0..512,
                512..1024,
                1024..1536,
                1536..2048,
                2048..2560,
                2560..3072,
                3072..3584,
                3584..4096,
                4096..4608,
                4608..5000
            ]
        );
        let k = b.kernels(1200, true, 680..690);
        assert_eq!(k, [WM, WM, WM, WM, WM, WM, WM, WM, WM, WM]);
        assert_eq!(b.kernels(686, false, 684..686), [WB, WB]);
        assert_eq!(b.kernels(695, false, 684..695)[8..], [WB, WB, WB]);
    }

    #[test]
    fn attention_tiles_large_micro_batches_and_splits_long_decodes() {
        use AttentionKernel::{Row, Split, Tiled};
        let b = PromptBatching::default();
        // 0..512, 512..684, 684..1196, 1196..1200.
        let k = b.attention_kernels(1200, true, 0..1200);
        assert!(k[..1196].iter().all(|&k| k == Tiled));
        assert_eq!(k[1196..], [Row; 4]);
        // A 40-token prompt is one small micro-batch; its decode splits from 256 cells on.
        assert_eq!(b.attention_kernels(40, false, 0..40), [Row; 40]);
        assert_eq!(b.attention_kernels(40, false, 255..256), [Row]);
        assert_eq!(
            b.attention_kernels(40, false, 300..301),
            [Split { cells: 512 }]
        );
        // Token by token, every prompt row is a lone row too.
        let k = PromptBatching::TOKEN_BY_TOKEN.attention_kernels(600, false, 0..600);
        assert_eq!(k[255], Row);
        assert_eq!(k[599], Split { cells: 768 });
    }

    #[test]
    fn token_by_token_is_always_alone() {
        let b = PromptBatching::TOKEN_BY_TOKEN;
        assert!(b.kernels(40, true, 0..40).iter().all(|&k| k == V));
    }

    #[test]
    fn the_choice_does_not_depend_on_how_positions_are_asked_for() {
        let b = PromptBatching::default();
        let whole = b.kernels(700, true, 0..700);
        let pieces: Vec<_> = [0..5, 5..333, 333..700]
            .into_iter()
            .flat_map(|r| b.kernels(700, true, r))
            .collect();
        assert_eq!(whole, pieces);
    }
}
