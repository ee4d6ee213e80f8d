//! The counters the engine keeps up to date, for metrics and tests.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Counters the engine keeps up to date, for metrics and tests.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub(super) running: AtomicUsize,
    /// Requests submitted with a group not yet admitted or dropped (in the channel or
    /// waiting); one request counts once however many prompt groups it has.
    pub(super) queued: AtomicUsize,
    pub(super) kv_reserved: AtomicUsize,
    pub(super) steps: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) generated_tokens: AtomicU64,
    pub(super) finished: AtomicU64,
    pub(super) abandoned: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) draft_tokens_accepted: AtomicU64,
    pub(super) draft_tokens_fed: AtomicU64,
    pub(super) prefix_cache_hit_tokens: AtomicU64,
    pub(super) images_encoded: AtomicU64,
}

impl EngineStats {
    /// A submission left the waiting queue (its last group was admitted or dropped).
    pub(super) fn leave_queue(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A copy of the engine's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Sequences in the running batch.
    pub running: usize,
    /// Requests submitted with a prompt group not yet admitted (one count per request,
    /// however many prompts it has).
    pub queued: usize,
    /// KV cache positions the running sequences reserve.
    pub kv_reserved: usize,
    /// KV cache positions they may reserve together.
    pub kv_budget: usize,
    /// Bytes one KV cache position takes.
    pub kv_position_bytes: usize,
    /// Forward steps run.
    pub steps: u64,
    /// Prompt tokens run through the model.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Sequences that finished normally.
    pub finished: u64,
    /// Sequences dropped because their receiver went away.
    pub abandoned: u64,
    /// Sequences ended by their deadline.
    pub timed_out: u64,
    /// Draft tokens (predicted, forced by a grammar, or found by prompt lookup) accepted:
    /// generated without a forward step of their own.
    pub draft_tokens_accepted: u64,
    /// Draft tokens fed to forward steps for verification, accepted or not.
    pub draft_tokens_fed: u64,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub prefix_cache_hit_tokens: u64,
    /// Image views run through the vision model (an image, or each tile and the global
    /// view of one a projector tiles; a view found in the embedding cache is not counted
    /// again).
    pub images_encoded: u64,
}
