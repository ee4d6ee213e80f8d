//! Scheduling policy, free of I/O: which waiting sequences to admit and how many tokens
//! each running sequence feeds into the next forward step.

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
}

/// How many waiting sequences (in queue order) to admit, given the KV positions each
/// needs and the positions already reserved by running ones.
pub fn admit(
    config: &SchedulerConfig,
    running: usize,
    reserved: usize,
    waiting: &[usize],
) -> usize {
    let mut admitted = 0;
    let mut reserved = reserved;
    for &need in waiting {
        if running + admitted >= config.max_running {
            break;
        }
        // A sequence larger than the whole budget still runs when it would run alone,
        // so that it is never starved.
        let alone = running + admitted == 0;
        if reserved + need > config.kv_budget && !alone {
            break;
        }
        reserved += need;
        admitted += 1;
    }
    admitted
}

/// Tokens each running sequence feeds into the next step, in the same order. Every
/// decoding sequence gets its one token; the remaining budget goes to prefill chunks,
/// oldest sequence first.
pub fn plan_step(config: &SchedulerConfig, running: &[RunningView]) -> Vec<usize> {
    let decoding = running.iter().filter(|r| r.pending_prefill == 0).count();
    let mut budget = config.max_step_tokens.saturating_sub(decoding);
    running
        .iter()
        .map(|r| {
            if r.pending_prefill == 0 {
                return 1;
            }
            let chunk = r.pending_prefill.min(budget);
            budget -= chunk;
            chunk
        })
        .collect()
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
        RunningView { pending_prefill }
    }

    #[test]
    fn decodes_always_run_and_prefill_fills_the_rest_in_order() {
        let plan = plan_step(&CONFIG, &[view(0), view(6), view(0), view(9)]);
        assert_eq!(plan, vec![1, 6, 1, 2]);
    }

    #[test]
    fn admission_respects_slots_and_kv_budget() {
        assert_eq!(admit(&CONFIG, 0, 0, &[40, 40, 40, 40]), 2);
        assert_eq!(admit(&CONFIG, 2, 0, &[1, 1]), 1);
        assert_eq!(
            admit(&CONFIG, 0, 0, &[500]),
            1,
            "an oversized request runs alone"
        );
        assert_eq!(admit(&CONFIG, 1, 10, &[500]), 0);
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
}
