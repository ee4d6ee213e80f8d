//! Encoded images kept by content hash, so that an image sent again (the same photo in
//! every turn of a conversation) is not encoded again. Least recently used out, within a
//! budget of bytes.

use std::collections::HashMap;
use std::sync::Arc;

/// Embeddings by image hash.
pub struct EmbeddingCache {
    entries: HashMap<[u8; 32], (Arc<Vec<f32>>, u64)>,
    budget_bytes: usize,
    held_bytes: usize,
    clock: u64,
}

impl EmbeddingCache {
    /// A cache of at most `budget_bytes` of embeddings (0 keeps none).
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            entries: HashMap::new(),
            budget_bytes,
            held_bytes: 0,
            clock: 0,
        }
    }

    /// The embeddings of the image `hash`, if kept.
    pub fn get(&mut self, hash: &[u8; 32]) -> Option<Arc<Vec<f32>>> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(hash).map(|(rows, used)| {
            *used = clock;
            rows.clone()
        })
    }

    /// Keeps the embeddings of the image `hash`, evicting the least recently used.
    pub fn insert(&mut self, hash: [u8; 32], rows: Arc<Vec<f32>>) {
        let bytes = rows.len() * 4;
        if bytes > self.budget_bytes || self.entries.contains_key(&hash) {
            return;
        }
        while self.held_bytes + bytes > self.budget_bytes {
            let oldest = *self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(h, _)| h)
                .expect("over budget means not empty");
            if let Some((old, _)) = self.entries.remove(&oldest) {
                self.held_bytes -= old.len() * 4;
            }
        }
        self.clock += 1;
        self.held_bytes += bytes;
        self.entries.insert(hash, (rows, self.clock));
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_goes_first_and_the_budget_holds() {
        let rows = |n: usize| Arc::new(vec![0f32; n]);
        let mut c = EmbeddingCache::new(400);
        c.insert([1; 32], rows(50));
        c.insert([2; 32], rows(40));
        assert!(c.get(&[1; 32]).is_some());
        c.insert([3; 32], rows(40));
        // 200 + 160 + 160 bytes > 400: the image used longest ago (2) goes.
        assert!(c.get(&[2; 32]).is_none());
        assert!(c.get(&[1; 32]).is_some() && c.get(&[3; 32]).is_some());
        assert_eq!(c.held_bytes(), 360);
        c.insert([4; 32], rows(101));
        assert!(c.get(&[4; 32]).is_none(), "larger than the whole budget");
        assert_eq!(c.held_bytes(), 360);
    }
}
