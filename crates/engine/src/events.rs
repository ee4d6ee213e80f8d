//! A sequence's events, from the engine to whoever reads them, with the count of those
//! not yet read. The engine stops generating for a sequence whose reader has fallen
//! [`MAX_UNREAD_EVENTS`] behind (a streaming client that stopped reading: its server
//! stops taking events once its own buffers are full), so that what a client does not
//! read is bounded, not queued for ever; it goes on once the reader catches up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::sequence::SequenceEvent;

/// Events a reader may leave unread before its sequence stops generating (a token each,
/// with its alternatives when asked for: some tens of KiB at most).
pub const MAX_UNREAD_EVENTS: usize = 64;

/// A new channel for one sequence's events.
pub(crate) fn channel() -> (EventSender, Events) {
    let (tx, rx) = unbounded_channel();
    let unread = Arc::new(AtomicUsize::new(0));
    (
        EventSender {
            tx,
            unread: Arc::clone(&unread),
        },
        Events { rx, unread },
    )
}

/// The engine's end of a sequence's events.
pub(crate) struct EventSender {
    tx: UnboundedSender<SequenceEvent>,
    unread: Arc<AtomicUsize>,
}

impl EventSender {
    /// Sends `event`; a reader that went away is noticed by [`EventSender::is_closed`].
    pub(crate) fn send(&self, event: SequenceEvent) {
        if self.tx.send(event).is_ok() {
            self.unread.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether the reader went away.
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Whether the reader is [`MAX_UNREAD_EVENTS`] or more behind.
    pub(crate) fn is_full(&self) -> bool {
        self.unread.load(Ordering::Acquire) >= MAX_UNREAD_EVENTS
    }
}

/// A sequence's events, as the engine sends them. Dropping it cancels the sequence at the
/// engine's next step.
pub struct Events {
    rx: UnboundedReceiver<SequenceEvent>,
    unread: Arc<AtomicUsize>,
}

impl Events {
    /// The next event; `None` once the engine has dropped the sequence.
    pub async fn recv(&mut self) -> Option<SequenceEvent> {
        let event = self.rx.recv().await?;
        self.unread.fetch_sub(1, Ordering::AcqRel);
        Some(event)
    }

    /// [`Events::recv`] for a thread outside an async runtime.
    pub fn blocking_recv(&mut self) -> Option<SequenceEvent> {
        let event = self.rx.blocking_recv()?;
        self.unread.fetch_sub(1, Ordering::AcqRel);
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_sees_how_far_behind_its_reader_is() {
        let (tx, mut rx) = channel();
        for _ in 0..MAX_UNREAD_EVENTS - 1 {
            tx.send(SequenceEvent::Aborted);
        }
        assert!(!tx.is_full());
        tx.send(SequenceEvent::Aborted);
        assert!(tx.is_full());
        assert!(rx.blocking_recv().is_some());
        assert!(!tx.is_full(), "one read: no longer full");
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        // Sends to a reader that left count nothing.
        tx.send(SequenceEvent::Aborted);
        assert!(!tx.is_full());
    }
}
