//! A sequence's events as the response builders read them, timed on the way for the
//! latency metrics: time to first token (from the request's arrival) and the time
//! between consecutive tokens.

use std::sync::Arc;
use std::time::Instant;

use ferrite_engine::{Events, SequenceEvent};
use futures::Stream;

use crate::state::AppState;

/// One sequence's events, timed.
pub(super) struct TimedEvents {
    events: Events,
    state: Arc<AppState>,
    arrived: Instant,
    last_token: Option<Instant>,
}

impl TimedEvents {
    /// Times `events` of a request that arrived at `arrived`.
    pub fn new(events: Events, state: Arc<AppState>, arrived: Instant) -> Self {
        Self {
            events,
            state,
            arrived,
            last_token: None,
        }
    }

    /// The next event; `None` once the engine has dropped the sequence.
    pub async fn recv(&mut self) -> Option<SequenceEvent> {
        let event = self.events.recv().await?;
        if matches!(event, SequenceEvent::Token { .. }) {
            let now = Instant::now();
            let metrics = &self.state.metrics;
            match self.last_token {
                None => metrics.time_to_first_token.observe(now - self.arrived),
                Some(last) => metrics.inter_token_latency.observe(now - last),
            }
            self.last_token = Some(now);
        }
        Some(event)
    }

    /// The events as a stream (dropping it drops the receiver, which cancels the
    /// sequence).
    pub fn into_stream(self) -> impl Stream<Item = SequenceEvent> {
        futures::stream::unfold(self, |mut timed| async move {
            let event = timed.recv().await?;
            Some((event, timed))
        })
    }
}
