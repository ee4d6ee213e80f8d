//! A product's `n × rows` output (row-major) written in place by parallel tasks, each of
//! which owns a range of output features (columns) for every activation row, so that no
//! task needs a buffer of its own to be copied afterwards.

use std::marker::PhantomData;
use std::ops::Range;

/// An output matrix lent to tasks that each write a disjoint range of columns.
pub struct Output<'a> {
    ptr: *mut f32,
    n: usize,
    rows: usize,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: tasks only write through `Columns`, whose ranges never overlap (see `columns`).
unsafe impl Send for Output<'_> {}
unsafe impl Sync for Output<'_> {}

impl<'a> Output<'a> {
    /// Lends `out`, an `n × rows` matrix.
    pub fn new(out: &'a mut [f32], n: usize, rows: usize) -> Self {
        assert_eq!(out.len(), n * rows);
        Self {
            ptr: out.as_mut_ptr(),
            n,
            rows,
            _out: PhantomData,
        }
    }

    /// Columns `range` of every row, for one task to write.
    ///
    /// # Safety
    /// No two `Columns` of the same output with overlapping ranges may exist at once.
    pub unsafe fn columns(&self, range: Range<usize>) -> Columns<'_> {
        assert!(range.end <= self.rows);
        Columns {
            output: self,
            range,
        }
    }
}

/// One task's columns of an [`Output`].
pub struct Columns<'a> {
    output: &'a Output<'a>,
    range: Range<usize>,
}

impl Columns<'_> {
    /// Writes `v` at activation row `t`, output feature `r` (which must be this task's).
    #[inline]
    pub fn set(&self, t: usize, r: usize, v: f32) {
        assert!(t < self.output.n && self.range.contains(&r));
        // SAFETY: in bounds (checked), and no other task writes this column.
        unsafe { *self.output.ptr.add(t * self.output.rows + r) = v };
    }

    /// Writes `values` at activation row `t` from output feature `r` on, leaving out
    /// those past this task's columns (`r` must be one of them).
    #[inline]
    pub fn set_run(&self, t: usize, r: usize, values: &[f32]) {
        assert!(t < self.output.n && self.range.contains(&r));
        let len = values.len().min(self.range.end - r);
        // SAFETY: in bounds (checked), and no other task writes these columns.
        unsafe {
            let to = self.output.ptr.add(t * self.output.rows + r);
            std::ptr::copy_nonoverlapping(values.as_ptr(), to, len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn tasks_fill_their_columns() {
        let (n, rows) = (3, 10);
        let mut out = vec![0f32; n * rows];
        let output = Output::new(&mut out, n, rows);
        (0..rows / 2).into_par_iter().for_each(|c| {
            // SAFETY: each task takes two columns of its own.
            let cols = unsafe { output.columns(2 * c..2 * c + 2) };
            for t in 0..n {
                for r in 2 * c..2 * c + 2 {
                    cols.set(t, r, (t * 100 + r) as f32);
                }
            }
        });
        let want: Vec<f32> = (0..n * rows)
            .map(|i| ((i / rows) * 100 + i % rows) as f32)
            .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn a_run_stops_at_the_end_of_the_columns() {
        let mut out = vec![0f32; 2 * 6];
        let output = Output::new(&mut out, 2, 6);
        // SAFETY: the only columns.
        let cols = unsafe { output.columns(1..4) };
        cols.set_run(1, 2, &[7.0, 8.0, 9.0, 10.0]);
        assert_eq!(out, [0., 0., 0., 0., 0., 0., 0., 0., 7., 8., 0., 0.]);
    }

    #[test]
    #[should_panic]
    fn a_column_outside_the_range_is_refused() {
        let mut out = vec![0f32; 4];
        let output = Output::new(&mut out, 1, 4);
        // SAFETY: the only columns.
        let cols = unsafe { output.columns(0..2) };
        cols.set(0, 2, 1.0);
    }
}
