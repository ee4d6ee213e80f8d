//! Software prefetches: how far ahead of its loads a kernel asks for weights, and the
//! lines asked for while a kernel computes on lines it already holds.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
#[cfg(test)]
use std::ops::Range;

/// Asks for every cache line of `bytes` bytes from `p` on, `distance` bytes further on,
/// into the first-level cache (nothing where that is 0). Any address will do: a prefetch
/// never faults, so running past the end of a matrix is harmless.
///
/// `distance` is [`crate::simd::cpu::prefetch_ahead`], which each kernel reads once, before its
/// loop: a plain local the compiler can test outside the loop (read inside it, from the
/// static, it cost 1B Q4_K_M prefill two fifths of its speed on a CPU without prefetch).
#[inline(always)]
pub fn prefetch_span<T>(p: *const T, bytes: usize, distance: usize) {
    if distance == 0 {
        return;
    }
    let ahead = (p as *const i8).wrapping_add(distance);
    for off in (0..bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off)) };
    }
}

/// Asks for every cache line that the `bytes` bytes from `p` on touch, into the
/// second-level cache (`prefetcht1`): from the line holding `p`, whatever its alignment, to
/// the one holding the last byte. Any address will do: a prefetch never faults.
#[inline(always)]
pub fn ask_for_lines<T>(p: *const T, bytes: usize) {
    const LINE: usize = 64;
    let misalign = p as usize % LINE;
    let first = (p as *const i8).wrapping_sub(misalign);
    for off in (0..misalign + bytes).step_by(LINE) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(first.wrapping_add(off)) };
    }
}

/// Lines of weights a kernel asks the memory for while it computes on lines it already
/// holds: in a product of several activation rows, the next group's lines during the
/// second and later passes over a group (the weight layouts' lane groups).
///
/// The first pass streams a group from memory, the later ones read it from the cache,
/// and the hardware's prefetchers, which follow the kernel's misses, then have none to
/// follow: the memory idled through them, and the time of a product was that of its
/// streaming plus that of its computing. Asked for a few lines at each step of the
/// later passes, the next group arrives while they compute.
///
/// `matmul_kernels`, 2 threads, matrices of 142–178 MiB, the builds alternating, giga
/// multiply-adds a second: Q4_1 at 8 rows 147 → 180, Q5_0 at 4 rows 81–85 → 126, Q4_K at
/// 8 rows 161–172 → 188–234, Q8_0 at 16 rows 135–137 → 176–179 (Gemma 3's output matrix
/// 126–131 → 147–152). A pass of one row after a pair asks for a whole group alone and
/// loses (Q8_0, 2048 wide, 3 rows: 72 → 57–60; Gemma's 640-wide one 81–82 → 74–79);
/// other counts of rows gain or stay. Into the second-level cache (`prefetcht1`): into
/// the first (`prefetcht0`), 4 rows of Q8_0 gained nothing.
pub struct Upcoming {
    /// The next line to ask for, and the end of the lines, as addresses.
    next: usize,
    end: usize,
    /// Bytes asked for at each step.
    per_step: usize,
}

impl Upcoming {
    /// Nothing to ask for.
    pub const NONE: Self = Self {
        next: 0,
        end: 0,
        per_step: 0,
    };

    /// `lines` asked for `per_step` lines a step (at least one).
    pub fn new<T>(lines: &[T], per_step: usize) -> Self {
        let at = lines.as_ptr() as usize;
        Self {
            next: at,
            end: at + size_of_val(lines),
            per_step: 64 * per_step.max(1),
        }
    }

    /// The addresses still to be asked for (for tests).
    #[cfg(test)]
    pub fn span(&self) -> Range<usize> {
        self.next..self.end.max(self.next)
    }

    /// Asks for the next step's share (nothing once all have been asked for).
    #[inline(always)]
    pub fn step(&mut self) {
        let stop = self.end.min(self.next + self.per_step);
        if self.next < stop {
            ask_for_lines(self.next as *const i8, stop - self.next);
            self.next = stop;
        }
    }
}
