//! Scheduling policy, free of I/O: which waiting sequences to admit and how many tokens
//! each running sequence feeds into the next forward step.

use std::collections::HashSet;

/// Limits the scheduler works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_running: usize,
    /// Most tokens in one forward step (decode tokens plus prefill chunks).
    pub max_step_tokens: usize,
    /// KV cache positions all running sequences may reserve together.
    pub kv_budget: usize,
}

/// What the scheduler needs to know about a running sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningView {
    /// Prompt tokens not yet in the cache (0 once decoding).
    pub pending_prefill: usize,
    /// Steps in a row whose plan gave this sequence's pending prompt no token.
    pub passed_over: usize,
    /// Its reader is too far behind: it gets no token until it catches up.
    pub blocked: bool,
    /// Most prompt tokens it may feed in one step (`usize::MAX`: no limit of its own; a
    /// prompt whose every position is scored takes a few, each a row of logits over the
    /// whole vocabulary).
    pub max_chunk: usize,
}

impl RunningView {
    /// Whether it takes a decode token this step: its prompt is in and its reader keeps
    /// up.
    pub fn decodes(&self) -> bool {
        self.pending_prefill == 0 && !self.blocked
    }
}

/// How many of `running` take a decode token this step.
pub fn decoding(running: &[RunningView]) -> usize {
    running.iter().filter(|r| r.decodes()).count()
}

/// Steps a pending prompt may be passed over before it goes ahead of shorter ones: a
/// steady stream of short prompts (one request of thousands, say) must not hold a longer
/// one back for ever.
pub const PASSED_OVER_LIMIT: usize = 2;

/// A waiting group of one request: one sequence, or the choices sharing a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitingView {
    /// KV positions the group needs (all its sequences together).
    pub need: usize,
    /// Sequences it will run.
    pub sequences: usize,
    /// The request it belongs to (a request's prompts are groups of their own).
    pub request: u64,
}

/// Slots past `max_running` kept for requests that have nothing running: a quarter of
/// them (none below four: a server run with one to three slots is held to them).
pub fn headroom(config: &SchedulerConfig) -> usize {
    config.max_running / 4
}

/// Which waiting groups (indices into `waiting`, which is in admission order) to admit,
/// given what each needs, the sequences running, the positions they reserve and the
/// requests they belong to.
///
/// Groups are taken in order while they fit the slots and the KV budget. Then a group of a
/// request that has nothing running yet may also take one of [`headroom`]'s slots past
/// `max_running` (the KV budget still holds): one request's choices or prompts filling
/// every slot for minutes (`n: 64`, `max_tokens: 300`) must not keep every other client
/// waiting until they end.
pub fn admit(
    config: &SchedulerConfig,
    running: usize,
    reserved: usize,
    running_requests: &HashSet<u64>,
    waiting: &[WaitingView],
) -> Vec<usize> {
    let mut admitted = Vec::new();
    let mut sequences = running;
    let mut reserved = reserved;
    for (i, w) in waiting.iter().enumerate() {
        // A request with more sequences than there are slots still runs when it would run
        // alone, so that it is never starved. The KV budget has no such exception: the
        // engine refuses a request that needs more than the whole budget.
        let alone = sequences == 0;
        if (!alone && sequences + w.sequences > config.max_running)
            || reserved + w.need > config.kv_budget
        {
            break;
        }
        reserved += w.need;
        sequences += w.sequences;
        admitted.push(i);
    }
    let mut served: HashSet<u64> = admitted.iter().map(|&i| waiting[i].request).collect();
    let limit = config.max_running + headroom(config);
    for (i, w) in waiting.iter().enumerate().skip(admitted.len()) {
        let newcomer = !running_requests.contains(&w.request) && !served.contains(&w.request);
        if newcomer && sequences + w.sequences <= limit && reserved + w.need <= config.kv_budget {
            reserved += w.need;
            sequences += w.sequences;
            served.insert(w.request);
            admitted.push(i);
        }
    }
    admitted
}

/// Tokens each running sequence feeds into the next step, in the same order. Every
/// decoding sequence gets its one token (but one whose reader is too far behind, which
/// gets none); the remaining budget goes to prefill chunks,
/// the shortest remaining prompt first, so that a short prompt is never held behind a
/// long one (which still gets whatever budget the short ones leave), but for prompts
/// passed over [`PASSED_OVER_LIMIT`] steps in a row, which go first (so every prompt
/// moves at least every few steps, however many short ones keep arriving).
pub fn plan_step(config: &SchedulerConfig, running: &[RunningView]) -> Vec<usize> {
    let mut budget = config.max_step_tokens.saturating_sub(decoding(running));
    let mut plan: Vec<usize> = running.iter().map(|r| usize::from(r.decodes())).collect();
    let mut prefilling: Vec<usize> = (0..running.len())
        .filter(|&i| running[i].pending_prefill > 0)
        .collect();
    prefilling.sort_by_key(|&i| {
        let starved = running[i].passed_over >= PASSED_OVER_LIMIT;
        (!starved, running[i].pending_prefill)
    });
    for i in prefilling {
        let chunk = running[i]
            .pending_prefill
            .min(budget)
            .min(running[i].max_chunk);
        budget -= chunk;
        plan[i] = chunk;
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: SchedulerConfig = SchedulerConfig {
        max_running: 3,
        max_step_tokens: 10,
        kv_budget: 100,
    };

    fn view(pending_prefill: usize) -> RunningView {
        RunningView {
            pending_prefill,
            passed_over: 0,
            blocked: false,
            max_chunk: usize::MAX,
        }
    }

    /// A long prompt among a steady stream of one-token prompts that fill the budget
    /// every step (a request of thousands of prompts) still gets tokens within a few
    /// steps, and then every few steps until it is done.
    #[test]
    fn a_stream_of_short_prompts_does_not_starve_a_longer_one() {
        let config = SchedulerConfig {
            max_running: 64,
            max_step_tokens: 50,
            kv_budget: 10_000,
        };
        let mut long = RunningView {
            pending_prefill: 8,
            passed_over: 0,
            blocked: false,
            max_chunk: usize::MAX,
        };
        let mut steps = 0;
        while long.pending_prefill > 0 {
            steps += 1;
            assert!(
                steps <= 8 * (PASSED_OVER_LIMIT + 1),
                "starved for {steps} steps"
            );
            // 63 fresh one-token prompts each step, ahead of it by length.
            let mut running = vec![view(1); 63];
            running.insert(17, long);
            let plan = plan_step(&config, &running);
            assert!(plan.iter().sum::<usize>() <= config.max_step_tokens);
            let got = plan[17];
            long.pending_prefill -= got;
            long.passed_over = if got == 0 { long.passed_over + 1 } else { 0 };
        }
        assert!(steps <= PASSED_OVER_LIMIT + 1, "took {steps} steps");
    }

    #[test]
    fn decodes_always_run_and_prefill_fills_the_rest_shortest_first() {
        let plan = plan_step(&CONFIG, &[view(0), view(6), view(0), view(9)]);
        assert_eq!(plan, vec![1, 6, 1, 2]);
        let plan = plan_step(&CONFIG, &[view(0), view(9), view(0), view(3)]);
        assert_eq!(plan, vec![1, 5, 1, 3], "the short prompt is not held back");
    }

    fn one(need: usize) -> WaitingView {
        WaitingView {
            need,
            sequences: 1,
            request: 0,
        }
    }

    /// How many of `waiting` (all of one request, running already) are admitted.
    fn admitted(running: usize, reserved: usize, waiting: &[WaitingView]) -> usize {
        admit(&CONFIG, running, reserved, &HashSet::from([0]), waiting).len()
    }

    #[test]
    fn admission_respects_slots_and_kv_budget() {
        assert_eq!(admitted(0, 0, &[one(40), one(40), one(40), one(40)]), 2);
        assert_eq!(admitted(2, 0, &[one(1), one(1)]), 1);
        assert_eq!(
            admitted(0, 0, &[one(500)]),
            0,
            "nothing runs over the KV budget, even alone"
        );
        assert_eq!(admitted(1, 10, &[one(500)]), 0);
    }

    #[test]
    fn a_group_counts_all_its_sequences() {
        let group = WaitingView {
            need: 30,
            sequences: 3,
            request: 0,
        };
        assert_eq!(admitted(1, 0, &[group]), 0, "1 + 3 > 3 slots");
        assert_eq!(admitted(0, 0, &[group, one(1)]), 1);
        let huge = WaitingView {
            need: 10,
            sequences: 50,
            request: 0,
        };
        assert_eq!(admitted(0, 0, &[huge]), 1, "runs alone");
    }

    #[test]
    fn a_request_with_nothing_running_gets_in_beside_one_that_fills_every_slot() {
        let config = SchedulerConfig {
            max_running: 64,
            max_step_tokens: 512,
            kv_budget: 100_000,
        };
        let from = |request: u64, sequences: usize| WaitingView {
            need: 10 * sequences,
            sequences,
            request,
        };
        // Request 1 runs 64 choices; its next prompt waits, then requests 2 to 20.
        let mut waiting = vec![from(1, 1)];
        waiting.extend((2..=20).map(|r| from(r, 1)));
        let running = HashSet::from([1]);
        let got = admit(&config, 64, 640, &running, &waiting);
        // Not request 1's: the headroom (16 slots) goes to newcomers, in order.
        assert_eq!(got, (1..=16).collect::<Vec<_>>());
        // A newcomer larger than the headroom waits for ordinary slots.
        let big = [from(2, 17)];
        assert!(admit(&config, 64, 640, &running, &big).is_empty());
        // One newcomer's second prompt waits: one place each.
        let two = [from(2, 1), from(2, 1)];
        assert_eq!(admit(&config, 64, 640, &running, &two), vec![0]);
        // The KV budget holds for newcomers too.
        assert!(admit(&config, 64, 100_000, &running, &[from(2, 1)]).is_empty());
    }

    #[test]
    fn every_step_makes_progress() {
        // Property: whatever the mix, the plan never exceeds the budget when the decodes
        // fit, and a prefill gets tokens whenever the decodes leave room.
        for decodes in 0..5 {
            for prefill in 1..30 {
                let mut running = vec![view(0); decodes];
                running.push(view(prefill));
                let plan = plan_step(&CONFIG, &running);
                let total: usize = plan.iter().sum();
                assert!(total <= CONFIG.max_step_tokens.max(decodes));
                if decodes < CONFIG.max_step_tokens {
                    assert!(plan[decodes] > 0);
                }
            }
        }
    }

    #[test]
    fn a_sequence_whose_reader_is_behind_gets_no_token_and_leaves_its_share() {
        let blocked = RunningView {
            blocked: true,
            ..view(0)
        };
        let plan = plan_step(&CONFIG, &[view(0), blocked, view(20)]);
        assert_eq!(plan[1], 0);
        assert_eq!(plan[0], 1);
        // Its decode slot goes to the prompt: 10 tokens less the one decode.
        assert_eq!(plan[2], 9);
    }
}
