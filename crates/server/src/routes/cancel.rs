//! Blocking work that stops when its client goes away. axum drops a handler's future
//! when the client disconnects; a [`CancelOnDrop`] held by the handler then sets the flag
//! that the blocking work (tokenizing a long prompt, say) looks at.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Sets its flag when dropped.
pub struct CancelOnDrop(Arc<AtomicBool>);

impl CancelOnDrop {
    /// A guard and the flag it will set, for the blocking work.
    pub fn new() -> (Self, Arc<AtomicBool>) {
        let flag = Arc::new(AtomicBool::new(false));
        (Self(Arc::clone(&flag)), flag)
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
