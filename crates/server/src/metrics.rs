//! Prometheus metrics: what the HTTP layer measures (requests by status, time to first
//! token, inter-token latency, request duration) in fixed-bucket histograms whose memory
//! never grows however long the server runs, plus the engine's counters read at scrape
//! time, all rendered in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferrite_engine::StatsSnapshot;

/// Bucket bounds (seconds) for time to first token and request duration.
const REQUEST_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// Bucket bounds (seconds) for the time between two tokens of a sequence.
const TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
];

/// A Prometheus histogram with fixed buckets, safe to update from any thread.
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations at most `bounds[i]` (not cumulative; summed when rendered), then one
    /// for everything above the last bound.
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    /// The sum of observations, as `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Records one duration.
    pub fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        let i = self.bounds.partition_point(|&b| b < seconds);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + seconds).to_bits())
            });
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {}", self.count.load(Ordering::Relaxed));
    }
}

/// The `status` label of `ferrite_requests_total` for a request whose client left before
/// its answer was complete.
pub const DISCONNECTED: &str = "disconnected";

/// Everything the HTTP layer measures.
pub struct Metrics {
    /// Requests by outcome label: the HTTP status, or [`DISCONNECTED`].
    requests_by_status: Mutex<BTreeMap<String, u64>>,
    /// From a completion request's arrival to its first generated token, per sequence.
    pub time_to_first_token: Histogram,
    /// Between two consecutive tokens of one sequence.
    pub inter_token_latency: Histogram,
    /// From a completion request's arrival to the end of its answer (its last streamed
    /// byte, for a stream).
    pub request_duration: Histogram,
    /// API requests that have arrived and whose answer is not complete yet: being read,
    /// tokenized, queued, generated or streamed.
    in_flight: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests_by_status: Mutex::new(BTreeMap::new()),
            time_to_first_token: Histogram::new(REQUEST_BUCKETS),
            inter_token_latency: Histogram::new(TOKEN_BUCKETS),
            request_duration: Histogram::new(REQUEST_BUCKETS),
            in_flight: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// One more API request in flight, until [`Metrics::leave`].
    pub fn enter(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// One API request fewer in flight (its answer is complete, or its client left).
    pub fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts one answered API request by its HTTP status.
    pub fn count_request(&self, status: u16) {
        self.count_label(status.to_string());
    }

    /// Counts one API request whose client went away before its answer was complete
    /// (before the answer, or in the middle of a stream).
    pub fn count_disconnected(&self) {
        self.count_label(DISCONNECTED.to_string());
    }

    fn count_label(&self, label: String) {
        let mut counts = self
            .requests_by_status
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *counts.entry(label).or_default() += 1;
    }

    /// Everything in the Prometheus text format; the engine's counters once it runs.
    pub fn render(&self, engine: Option<StatsSnapshot>) -> String {
        let mut out = String::new();
        let mut single = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        single(
            "ferrite_ready",
            "gauge",
            "1 once the model is loaded and warmed up.",
            f64::from(u8::from(engine.is_some())),
        );
        single(
            "ferrite_http_requests_in_flight",
            "gauge",
            "API requests (probes and metrics aside) whose answer is not complete: being read, tokenized, queued, generated or streamed.",
            self.in_flight.load(Ordering::Relaxed) as f64,
        );
        if let Some(s) = engine {
            let bytes = |positions: usize| (positions as f64) * s.kv_position_bytes as f64;
            let engine_metrics: [(&str, &str, &str, f64); 16] = [
                ("ferrite_requests_running", "gauge", "Sequences (one per choice) being generated.", s.running as f64),
                ("ferrite_requests_waiting", "gauge", "Requests waiting for admission (one per request, whatever its prompts).", s.queued as f64),
                ("ferrite_kv_cache_usage_ratio", "gauge", "Share of the KV cache budget the running sequences reserve.", ratio(s.kv_reserved, s.kv_budget)),
                ("ferrite_prompt_tokens_total", "counter", "Prompt tokens run through the model (prefix-cache hits excluded).", s.prompt_tokens as f64),
                ("ferrite_generation_tokens_total", "counter", "Tokens generated.", s.generated_tokens as f64),
                ("ferrite_requests_finished_total", "counter", "Sequences that finished normally.", s.finished as f64),
                ("ferrite_requests_cancelled_total", "counter", "Sequences dropped because their client went away.", s.abandoned as f64),
                ("ferrite_requests_timed_out_total", "counter", "Sequences ended by their deadline (inference_timeout or --request-timeout), or because their client stopped reading (--response-write-timeout).", s.timed_out as f64),
                ("ferrite_forward_steps_total", "counter", "Batched forward steps run.", s.steps as f64),
                ("ferrite_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose keys and values came from the prefix cache.", s.prefix_cache_hit_tokens as f64),
                ("ferrite_draft_tokens_accepted_total", "counter", "Draft tokens (predicted, forced by a grammar, or found by prompt lookup) accepted: generated without a forward step of their own.", s.draft_tokens_accepted as f64),
                ("ferrite_draft_tokens_fed_total", "counter", "Draft tokens fed to forward steps for verification, accepted or not.", s.draft_tokens_fed as f64),
                ("ferrite_kv_cache_budget_positions", "gauge", "KV cache positions the running sequences may reserve together.", s.kv_budget as f64),
                ("ferrite_kv_cache_budget_bytes", "gauge", "Bytes of KV cache the running sequences may reserve together (positions times the bytes a position takes in the cache's types).", bytes(s.kv_budget)),
                ("ferrite_kv_cache_reserved_bytes", "gauge", "Bytes of KV cache the running sequences reserve.", bytes(s.kv_reserved)),
                ("ferrite_images_encoded_total", "counter", "Image views run through the vision model: one for an image, or each tile and the global view of an image a projector tiles (a view seen again comes from the embedding cache and is not counted).", s.images_encoded as f64),
            ];
            for (name, kind, help, value) in engine_metrics {
                single(name, kind, help, value);
            }
        }
        out.push_str(
            "# HELP ferrite_requests_total API requests by HTTP status, or status=\"disconnected\" when the client left before the answer was complete.\n\
             # TYPE ferrite_requests_total counter\n",
        );
        for (status, count) in self
            .requests_by_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(out, "ferrite_requests_total{{status=\"{status}\"}} {count}");
        }
        self.time_to_first_token.render(
            &mut out,
            "ferrite_time_to_first_token_seconds",
            "From a completion request's arrival to each sequence's first token.",
        );
        self.inter_token_latency.render(
            &mut out,
            "ferrite_inter_token_latency_seconds",
            "Between two consecutive tokens of a sequence.",
        );
        self.request_duration.render(
            &mut out,
            "ferrite_request_duration_seconds",
            "From a completion or chat request's arrival to the end of its answer.",
        );
        out
    }
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_count_into_cumulative_buckets() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(100));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"1\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_count 4\n"), "{out}");
        let sum: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("x_sum "))
            .and_then(|v| v.parse().ok())
            .expect("a sum line");
        assert!((sum - 5.65).abs() < 1e-9, "{out}");
    }

    #[test]
    fn requests_are_counted_by_status() {
        let m = Metrics::default();
        m.count_request(200);
        m.count_request(200);
        m.count_request(429);
        m.count_disconnected();
        let out = m.render(None);
        assert!(out.contains("ferrite_requests_total{status=\"200\"} 2\n"));
        assert!(out.contains("ferrite_requests_total{status=\"disconnected\"} 1\n"));
        assert!(out.contains("ferrite_requests_total{status=\"429\"} 1\n"));
        assert!(out.contains("ferrite_ready 0\n"));
        assert!(!out.contains("ferrite_requests_running"));
    }

    #[test]
    fn requests_in_flight_are_a_gauge() {
        let m = Metrics::default();
        m.enter();
        m.enter();
        m.leave();
        assert!(m.render(None).contains(
            "# TYPE ferrite_http_requests_in_flight gauge\nferrite_http_requests_in_flight 1\n"
        ));
    }
}
