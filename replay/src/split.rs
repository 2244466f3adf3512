//! Frame-mode batches split across shards by environment.

use millrace_proto::{FrameLinks, TransitionBatch};

/// The shard that holds environment `env` of actor `actor`: an environment's frames
/// always go to the same shard (its later frames link to them there), and one actor's
/// environments spread over all shards, so a single actor fills the whole table.
pub fn shard_of(actor: u32, env: u32, shards: usize) -> usize {
    ((u64::from(actor) + u64::from(env)) % shards as u64) as usize
}

/// Splits a (validated) frame-mode batch into one part per shard that gets any of its
/// frames or transitions, each part with the batch's actor, sequence number and
/// version, its frames and transitions in their original order.
pub fn by_environment(batch: &TransitionBatch, shards: usize) -> Vec<(usize, TransitionBatch)> {
    let links = batch.frames.as_ref().expect("a frame-mode batch");
    let rb = batch.obs_row_bytes;
    let mut parts: Vec<Option<TransitionBatch>> = (0..shards).map(|_| None).collect();
    let empty = || TransitionBatch {
        actor_id: batch.actor_id,
        agent: batch.agent,
        seq: batch.seq,
        version: batch.version,
        obs_row_bytes: rb,
        frames: Some(Box::new(FrameLinks::new(links.stack))),
        ..TransitionBatch::default()
    };
    for j in 0..links.frames() {
        let p = parts[shard_of(batch.actor_id, links.env[j], shards)].get_or_insert_with(empty);
        p.push_obs_bytes(batch.obs_row(j as u32));
        let l = p.frames.as_mut().expect("frame mode");
        l.number.push(links.number[j]);
        l.env.push(links.env[j]);
        l.prev.push(links.prev[j]);
    }
    for i in 0..batch.len() {
        let p =
            parts[shard_of(batch.actor_id, links.item_env[i], shards)].get_or_insert_with(empty);
        p.actions.push(batch.actions[i]);
        p.rewards.push(batch.rewards[i]);
        p.discounts.push(batch.discounts[i]);
        if let Some(priority) = batch.priorities.get(i) {
            p.priorities.push(*priority);
        }
        let l = p.frames.as_mut().expect("frame mode");
        l.item_env.push(links.item_env[i]);
        l.obs.push(links.obs[i]);
        l.next.push(links.next[i]);
    }
    parts
        .into_iter()
        .enumerate()
        .filter_map(|(s, p)| p.map(|p| (s, p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::NO_FRAME;

    #[test]
    fn parts_keep_each_environment_whole_and_in_order() {
        let mut b = TransitionBatch {
            actor_id: 1,
            seq: 7,
            obs_row_bytes: 1,
            frames: Some(Box::new(FrameLinks::new(2))),
            ..TransitionBatch::default()
        };
        for (n, env) in [(0u64, 0u32), (1, 1), (2, 0), (3, 1), (4, 2)] {
            b.push_obs_bytes(&[n as u8]);
            let l = b.frames.as_mut().unwrap();
            l.number.push(n);
            l.env.push(env);
            l.prev.push(if n >= 2 { n - 2 } else { NO_FRAME });
        }
        for (env, o, n) in [(0u32, 0u64, 2u64), (1, 1, 3)] {
            b.actions.push(i64::from(env));
            b.rewards.push(0.0);
            b.discounts.push(1.0);
            let l = b.frames.as_mut().unwrap();
            l.item_env.push(env);
            l.obs.push(o);
            l.next.push(n);
        }
        b.validate(2, 2).unwrap();
        let parts = by_environment(&b, 2);
        // Actor 1: environments 1 → shard 0, 0 and 2 → shard 1.
        assert_eq!(parts.len(), 2);
        let (s0, p0) = &parts[0];
        let (s1, p1) = &parts[1];
        assert_eq!((*s0, *s1), (0, 1));
        assert_eq!(p0.obs, [1, 3]);
        assert_eq!(p1.obs, [0, 2, 4]);
        assert_eq!(p0.frames.as_ref().unwrap().prev, [NO_FRAME, 1]);
        assert_eq!(p0.actions, [1]);
        assert_eq!(p1.frames.as_ref().unwrap().obs, [0]);
        for (_, p) in &parts {
            p.validate(2, 2).unwrap();
            assert_eq!((p.actor_id, p.seq), (1, 7));
        }
    }
}
