//! Which curator a node talks to first: rendezvous (highest-random-weight) hashing of
//! the node's own seed (its address) with each curator's endpoint.
//!
//! Every node used to take the first reachable curator of the directory, so all streams
//! and connections of a fleet sat on one curator. Ordering the directory by
//! `SHA-256(seed ‖ endpoint)` instead spreads nodes evenly over the curators, keeps each
//! node's choice stable while the directory does not change, and when a curator goes,
//! moves only the nodes that preferred it (each to its own second choice).
//!
//! Pure: a leaf of the crate, no I/O.

use std::net::SocketAddr;

/// `endpoints` ordered by this node's preference (`seed`: something unique and stable
/// per node, e.g. its address). A permutation: nothing is added or dropped.
pub fn by_preference(seed: &[u8], endpoints: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut scored: Vec<(Vec<u8>, SocketAddr)> = endpoints
        .iter()
        .map(|endpoint| (weight(seed, endpoint), *endpoint))
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, endpoint)| endpoint).collect()
}

fn weight(seed: &[u8], endpoint: &SocketAddr) -> Vec<u8> {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(&(seed.len() as u64).to_be_bytes());
    context.update(seed);
    context.update(endpoint.to_string().as_bytes());
    context.finish().as_ref().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curators(n: u8) -> Vec<SocketAddr> {
        (1..=n)
            .map(|i| SocketAddr::from(([127, 0, 0, i], 7835)))
            .collect()
    }

    fn first_choice_counts(nodes: u32, curators: &[SocketAddr]) -> Vec<u32> {
        let mut counts = vec![0u32; curators.len()];
        for node in 0..nodes {
            let first = by_preference(&node.to_be_bytes(), curators)[0];
            counts[curators.iter().position(|c| *c == first).unwrap()] += 1;
        }
        counts
    }

    #[test]
    fn a_permutation_stable_per_seed() {
        let all = curators(5);
        let a = by_preference(b"10.0.0.7", &all);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, all);
        assert_eq!(by_preference(b"10.0.0.7", &all), a);
        // The order of the directory does not matter.
        let reversed: Vec<_> = all.iter().rev().copied().collect();
        assert_eq!(by_preference(b"10.0.0.7", &reversed), a);
        assert!(by_preference(b"x", &[]).is_empty());
    }

    #[test]
    fn nodes_spread_evenly_over_curators() {
        for n in [2u8, 3, 5] {
            let counts = first_choice_counts(3000, &curators(n));
            let mean = 3000 / n as u32;
            for c in &counts {
                assert!(
                    *c > mean * 8 / 10 && *c < mean * 12 / 10,
                    "{n} curators: first choices {counts:?} (mean {mean})"
                );
            }
        }
    }

    #[test]
    fn losing_a_curator_moves_only_its_nodes() {
        let all = curators(3);
        let without_first: Vec<_> = all[1..].to_vec();
        for node in 0..500u32 {
            let seed = node.to_be_bytes();
            let before = by_preference(&seed, &all);
            let after = by_preference(&seed, &without_first);
            if before[0] != all[0] {
                assert_eq!(after[0], before[0], "node {node} moved needlessly");
            } else {
                assert_eq!(
                    after[0], before[1],
                    "node {node} took not its second choice"
                );
            }
        }
    }
}
