//! Checkpoints: what a run keeps, so that what it reports is what it saved.
//!
//! Layout of a run's checkpoint directory (`<logdir>/checkpoint/`):
//! - `config.json`: the run's effective configuration, every setting;
//! - `latest/`: the full state for `--resume`: `model-<updates>-<generation>.safetensors`
//!   (tensors `online`, `target`, `adam_m`, `adam_v`, each `[K, P]` f32),
//!   `replay-<updates>-<generation>.bin`
//!   (replay's contents, see [`replay_file`]) and `meta.json` (specs, counters, the rate
//!   limiter's among them, and the last evaluation);
//! - `best/`: the parameters of the evaluation with the highest mean return so far
//!   (the earliest on ties), exactly as they were played:
//!   `policy-<version>-<generation>.safetensors`
//!   (`online`, `[K, P]`) and `meta.json` (version, env steps, updates, the evaluation's
//!   mean and spread);
//! - `solved/`: likewise, for the parameters that reached the target and were confirmed
//!   on fresh episodes (both evaluations in `meta.json`), once the run is solved.
//!
//! Every file is written to a temporary name, synced and renamed; `meta.json` is renamed
//! last and is each directory's commit point, so a crash at any moment leaves the
//! previous checkpoint intact. The generation (each save of a directory counts one) is
//! in every file name, so no save writes over a file the committed `meta.json` names,
//! and what a killed save left (`*.tmp.<host>.<pid>.<n>`) is removed when the next run
//! starts.

pub mod files;
mod layout;
mod policy;
pub mod replay_file;
mod state;
pub mod writer;

pub use layout::{Layout, Which};
pub use policy::{
    load_policy, save_evaluated, save_policy, saved_eval, saved_learning_rate, PolicyMeta,
    PolicyOwner, SavedPolicy,
};
pub use state::{
    check_fits, load_state, load_state_meta, restore_replay, save_state, Saved, StateMeta,
};

pub use files::CheckpointError;

/// Bumped when the layout changes incompatibly (1: one flat directory; 2: `latest/`,
/// `best/`, `solved/`; 3: the network's IMPALA torso in `meta.json`, which a build that
/// reads only 2 would silently drop).
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format this build still reads: a format-2 checkpoint is a format-3 one
/// without an IMPALA torso.
pub const OLDEST_FORMAT: u32 = 2;
pub(crate) const META: &str = "meta.json";
pub(crate) const TENSORS: [&str; 4] = ["online", "target", "adam_m", "adam_v"];

#[cfg(test)]
mod tests {
    use std::fs;

    use millrace_proto::{EnvSpec, NetworkSpec};
    use millrace_replay::Table;
    use tch::{Device, Kind, Tensor};

    use super::files::read_json;
    use super::*;
    use crate::evaluation::EvalRecord;
    use millrace_core::dqn::{Dqn, DqnConfig, TargetUpdate};
    use millrace_proto::TransitionBatch;
    use millrace_replay::{ItemKey, RateLimiterConfig, ReplayConfig, SampleBuffers};
    use rand::SeedableRng;

    fn setup() -> (EnvSpec, NetworkSpec, Dqn) {
        let env = millrace_actor::env::spec("CartPole-v1").unwrap();
        let net = NetworkSpec::mlp(&env.obs, &[16], 2, 1).unwrap();
        let cfg = DqnConfig {
            lr: 1e-3,
            target: TargetUpdate::Hard { period: 2 },
            ..DqnConfig::default()
        };
        let mut dqn = Dqn::new(net.clone(), cfg, Device::Cpu, 0);
        let batch = millrace_core::dqn::Batch {
            obs2: Tensor::ones([1, 8, 4], (Kind::Float, Device::Cpu)),
            actions: Tensor::ones([1, 4, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::ones([1, 4, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 4, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        };
        for _ in 0..3 {
            let _ = dqn.update(&batch);
        }
        (env, net, dqn)
    }

    fn meta(env: &EnvSpec, net: &NetworkSpec) -> StateMeta {
        StateMeta {
            format: FORMAT_VERSION,
            model_file: String::new(),
            replay_file: None,
            env: env.clone(),
            network: net.clone(),
            seed: 9,
            updates: 3,
            adam_step: 3,
            env_steps: 1234,
            params_version: 7,
            replay_inserts: 1000,
            replay_samples: 500,
            last_eval: None,
            run_finished: None,
            dueling: false,
            model_crc32c: None,
            generation: 0,
        }
    }

    #[test]
    fn a_dueling_learner_resumes_and_its_latest_policy_is_the_published_network() {
        let (env, net, _) = setup();
        let cfg = DqnConfig {
            dueling: true,
            ..DqnConfig::default()
        };
        let dqn = Dqn::new(net.clone(), cfg.clone(), Device::Cpu, 3);
        let dir = tempfile::tempdir().unwrap();
        save_state(
            &dir.path().join("latest"),
            &dqn.state(),
            None,
            meta(&env, &net),
        )
        .unwrap();
        let (m, state, _) = load_state(dir.path()).unwrap();
        assert!(m.dueling, "the learner's layout is recorded");
        assert_eq!(m.network, net, "the published network");
        let resumed = Dqn::from_state(net.clone(), cfg, Device::Cpu, state);
        assert_eq!(resumed.online_params(), dqn.online_params());
        let latest = load_policy(dir.path(), Some(Which::Latest)).unwrap();
        assert_eq!(
            latest.online,
            dqn.online_params(),
            "folded to the plain network"
        );
        assert_eq!(latest.online.len(), net.layout().len);
    }

    fn record(version: u64, mean: f32) -> EvalRecord {
        EvalRecord {
            params_version: version,
            env_steps: 100 * version,
            updates: 10 * version,
            episodes: 100,
            seed: 1,
            mean,
            std: 2.0,
            stderr: 0.2,
            min: mean - 5.0,
            max: mean + 1.0,
        }
    }

    #[test]
    fn round_trip_restores_every_tensor_and_counter() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        let state = dqn.state();
        let mut m = meta(&env, &net);
        m.last_eval = Some(record(5, 200.0));
        save_state(&layout.latest(), &state, None, m).unwrap();
        // The root, latest/ and latest/meta.json all name the same state.
        for path in [
            dir.path().to_path_buf(),
            layout.latest(),
            layout.latest().join("meta.json"),
        ] {
            let (m, loaded, at) = load_state(&path).unwrap();
            assert_eq!(at, layout.latest());
            assert_eq!((m.env_steps, m.replay_samples), (1234, 500));
            assert_eq!(m.last_eval.as_ref().unwrap().mean, 200.0);
            assert_eq!((loaded.updates, loaded.adam_step), (3, 3));
            assert!(loaded.online.equal(&state.online));
            assert!(loaded.target.equal(&state.target));
            assert!(loaded.adam_m.equal(&state.adam_m));
            assert!(loaded.adam_v.equal(&state.adam_v));
            check_fits(&m, &env, &net).unwrap();
        }
        assert!(
            !state.online.equal(&state.target),
            "target lags the online net"
        );
    }

    /// One update on a one-transition batch (the networks and the update count move).
    fn one_update(dqn: &mut Dqn) {
        let batch = millrace_core::dqn::Batch {
            obs2: Tensor::ones([1, 2, 4], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([1, 1, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::ones([1, 1, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 1, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        };
        let _ = dqn.update(&batch);
    }

    /// The names in `dir`, sorted.
    fn files(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_failed_save_removes_what_it_wrote_and_keeps_the_standing_generation() {
        let (env, net, mut dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        // No generation yet, and meta.json cannot be written (a directory is in its
        // place, as a full disk would fail the write): nothing of the attempt stays.
        fs::create_dir_all(dir.path().join("meta.json/x")).unwrap();
        assert!(save_state(dir.path(), &dqn.state(), None, meta(&env, &net)).is_err());
        assert_eq!(files(dir.path()), ["meta.json"]);
        // A standing generation survives a later failed save, which leaves nothing.
        fs::remove_dir_all(dir.path().join("meta.json")).unwrap();
        save_state(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        let standing = files(dir.path());
        dqn.sync_target();
        one_update(&mut dqn);
        let meta_json = dir.path().join("meta.json");
        // Fail the commit again by a directory in its way (root ignores permissions),
        // keeping the standing meta.json's content to put back.
        let text = fs::read(&meta_json).unwrap();
        fs::remove_file(&meta_json).unwrap();
        fs::create_dir_all(meta_json.join("x")).unwrap();
        assert!(save_state(dir.path(), &dqn.state(), None, meta(&env, &net)).is_err());
        fs::remove_dir_all(&meta_json).unwrap();
        fs::write(&meta_json, text).unwrap();
        assert_eq!(
            files(dir.path()),
            standing,
            "the new model file went with the failure"
        );
    }

    #[test]
    fn a_second_save_replaces_the_first_and_leaves_no_temporaries() {
        let (env, net, mut dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        save_state(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        dqn.sync_target();
        one_update(&mut dqn);
        save_state(dir.path(), &dqn.state(), None, meta(&env, &net)).unwrap();
        assert_eq!(
            files(dir.path()),
            ["meta.json", "model-000000000004-000002.safetensors"]
        );
    }

    #[test]
    fn a_save_never_writes_over_a_file_the_committed_meta_names() {
        // Regression (issue "One bad transition…", part 5): two saves at the same update
        // count wrote `replay-<U>.bin` over the file the committed meta.json named, so a
        // kill before the new meta.json left the old counters over new contents.
        let (env, net, dqn) = setup();
        let table = replay_table(3, 1000);
        fill(&table);
        let held_then = table.len();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        let (first, _, _) = load_state(dir.path()).unwrap();
        let named = [first.model_file.clone(), first.replay_file.clone().unwrap()];
        let bytes: Vec<Vec<u8>> = named
            .iter()
            .map(|f| fs::read(latest.join(f)).unwrap())
            .collect();
        // A second save at the same update count, with more in replay, that dies before
        // its commit: its meta.json cannot be renamed into place (a directory stands
        // there), so the committed one is put back afterwards as a kill would leave it.
        fill(&table);
        let meta_path = latest.join("meta.json");
        let committed = latest.join("committed.json");
        fs::rename(&meta_path, &committed).unwrap();
        fs::create_dir_all(meta_path.join("in-the-way")).unwrap();
        assert!(save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).is_err());
        fs::remove_dir_all(&meta_path).unwrap();
        fs::rename(&committed, &meta_path).unwrap();
        for (name, before) in named.iter().zip(&bytes) {
            assert!(
                fs::read(latest.join(name)).unwrap() == *before,
                "{name} was replaced"
            );
        }
        let (back, _, at) = load_state(dir.path()).unwrap();
        assert_eq!(back, first);
        let restored = replay_table(3, 1000);
        let held = restore_replay(&at, &back, &restored, 10).unwrap().held;
        assert_eq!(held, held_then, "the replay the committed meta counted");
        // And a save that commits moves on to the next generation's names.
        save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        let (now, _, _) = load_state(dir.path()).unwrap();
        assert_eq!((now.updates, now.generation), (first.updates, 2));
        assert!(!named.contains(&now.model_file));
    }

    fn replay_config(shards: usize, capacity: usize) -> ReplayConfig {
        ReplayConfig {
            capacity,
            shards,
            obs_row_bytes: 16,
            stack: 1,
            obs_rows_per_item: 1.5,
            limiter: RateLimiterConfig::sample_to_insert_ratio(4.0, 10, 1e9, 8).unwrap(),
            priority: None,
        }
    }

    fn replay_table(shards: usize, capacity: usize) -> Table {
        Table::new(&replay_config(shards, capacity)).unwrap()
    }

    /// Seven batches of five transitions (rewards = batch number), 35 in all.
    fn fill(table: &Table) {
        for seq in 0..7u64 {
            let mut b = TransitionBatch::with_capacity(16, 5, 6);
            for i in 0..6 {
                b.push_obs_f32(&[(seq * 10 + i) as f32, 0.0, 0.0, 0.0]);
            }
            for i in 0..5u32 {
                b.push_transition(i, i64::from(i % 2), seq as f32, 0.99, i + 1);
            }
            (b.actor_id, b.seq, b.version) = (1, seq, seq);
            table.insert(&b).unwrap();
        }
    }

    fn sample(table: &Table, n: usize) -> Option<Vec<f32>> {
        let mut rows = vec![0u8; 16 * n];
        let mut next = vec![0u8; 16 * n];
        let (mut a, mut r, mut d) = (vec![0i64; n], vec![-1f32; n], vec![0f32; n]);
        let mut keys = vec![ItemKey::default(); n];
        let mut out = SampleBuffers {
            obs: &mut rows,
            next_obs: &mut next,
            actions: &mut a,
            rewards: &mut r,
            discounts: &mut d,
            keys: &mut keys,
            weights: &mut vec![0f32; n],
        };
        let got = table
            .try_sample(&mut rand::rngs::SmallRng::seed_from_u64(0), &mut out)
            .unwrap();
        got.map(|_| r)
    }

    #[test]
    fn priorities_survive_a_checkpoint_and_resume_samples_the_same_distribution() {
        let prioritized = |shards: usize| {
            Table::new(&ReplayConfig {
                priority: Some(millrace_replay::PriorityConfig {
                    alpha: 0.6,
                    beta: 0.4,
                }),
                ..replay_config(shards, 1000)
            })
            .unwrap()
        };
        let (env, net, dqn) = setup();
        let table = prioritized(3);
        fill(&table);
        // The learner's TD errors on a sample: distinct priorities to keep.
        let n = 16;
        let mut out = millrace_replay::SampleScratch::new(n, 16);
        table
            .try_sample(
                &mut rand::rngs::SmallRng::seed_from_u64(1),
                &mut out.buffers(),
            )
            .unwrap()
            .unwrap();
        let keys = out.keys;
        let td: Vec<f32> = (0..n).map(|i| 0.5 + 3.0 * i as f32).collect();
        assert!(
            table
                .update_priorities(&millrace_replay::PriorityUpdate {
                    keys: keys.clone(),
                    priorities: td.clone(),
                })
                .applied
                > 0
        );
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        let (m, _, at) = load_state(dir.path()).unwrap();
        let restored = prioritized(2);
        assert_eq!(restore_replay(&at, &m, &restored, 10).unwrap().held, 35);
        // Every item (by its first observation) keeps its priority.
        let priorities = |t: &Table| {
            let mut v: Vec<(u32, u32)> = Vec::new();
            t.snapshot(|_, b| {
                for (i, p) in b.priorities.iter().enumerate() {
                    let row = b.obs_index[i] as usize * 16;
                    let x = f32::from_ne_bytes(b.obs[row..row + 4].try_into().unwrap());
                    v.push((x.to_bits(), p.to_bits()));
                }
            });
            v.sort_unstable();
            v
        };
        let before = priorities(&table);
        assert_eq!(before.len(), 35);
        assert!(
            before.iter().any(|(_, p)| f32::from_bits(*p) > 1.0),
            "updated"
        );
        assert_eq!(priorities(&restored), before);
        assert_eq!(restored.stats().max_priority, table.stats().max_priority);
    }

    #[test]
    fn a_replay_that_cannot_be_written_keeps_the_previous_one() {
        let (env, net, dqn) = setup();
        let table = replay_table(3, 1000);
        fill(&table);
        sample(&table, 8).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        let first = save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        assert_eq!(first.replay_error, None);
        let (m0, _, _) = load_state(dir.path()).unwrap();
        let old_replay = m0.replay_file.clone().expect("replay written");
        // The next generation's replay cannot be written (a directory is in its place:
        // as a full disk would, the write fails at its rename).
        let mut state = dqn.state();
        state.updates += 5;
        let name = format!("replay-{:012}-{:06}.bin", state.updates, m0.generation + 1);
        let tmp = latest.join(&name);
        fs::create_dir_all(tmp.join("x")).unwrap();
        sample(&table, 8).unwrap();
        let second = save_state(&latest, &state, Some(&table), meta(&env, &net)).unwrap();
        assert!(second.replay_error.is_some(), "{second:?}");
        let (m1, _, at) = load_state(dir.path()).unwrap();
        assert_eq!(m1.updates, state.updates, "the new networks are kept");
        assert_eq!(m1.replay_file.as_deref(), Some(old_replay.as_str()));
        assert_eq!(
            (m1.replay_inserts, m1.replay_samples),
            (m0.replay_inserts, m0.replay_samples),
            "with the counters that go with it"
        );
        let restored = replay_table(3, 1000);
        assert_eq!(restore_replay(&at, &m1, &restored, 10).unwrap().held, 35);
        // Once a replay is written again, the old one goes.
        fs::remove_dir_all(&tmp).unwrap();
        state.updates += 1;
        let third = save_state(&latest, &state, Some(&table), meta(&env, &net)).unwrap();
        assert_eq!(third.replay_error, None);
        let (m2, _, _) = load_state(dir.path()).unwrap();
        assert_ne!(m2.replay_file.as_deref(), Some(old_replay.as_str()));
        assert!(!latest.join(&old_replay).exists());
    }

    #[test]
    fn a_crafted_meta_json_is_refused_in_one_line_before_anything_is_allocated() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), None, meta(&env, &net)).unwrap();
        let path = latest.join(META);
        let good: serde_json::Value = read_json(&path).unwrap();
        let crafted = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v = good.clone();
            edit(&mut v);
            fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
            let e = load_state(dir.path()).unwrap_err().to_string();
            let p = load_policy(dir.path(), Some(Which::Latest))
                .unwrap_err()
                .to_string();
            assert!(!e.contains('\n') && !p.contains('\n'), "{e}");
            e
        };
        // A dueling head over 200,000 actions would allocate about 160 GB.
        let e = crafted(&|v| {
            v["dueling"] = true.into();
            v["network"]["num_actions"] = 200_000.into();
        });
        assert!(e.contains("200000 actions"), "{e}");
        let e = crafted(&|v| {
            v["dueling"] = true.into();
            v["network"]["num_actions"] = 5000.into();
        });
        assert!(e.contains("dueling head"), "{e}");
        let e = crafted(&|v| v["network"]["hidden"] = serde_json::json!([1u64 << 40, 8]));
        assert!(e.contains("parameters"), "{e}");
    }

    #[test]
    fn replay_and_its_counters_survive_a_checkpoint() {
        let (env, net, dqn) = setup();
        let table = replay_table(3, 1000);
        fill(&table);
        sample(&table, 8).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), Some(&table), meta(&env, &net)).unwrap();
        let (m, _, at) = load_state(dir.path()).unwrap();
        assert_eq!((m.replay_inserts, m.replay_samples), (35, 8));

        let restored = replay_table(3, 1000);
        let r = restore_replay(&at, &m, &restored, 10).unwrap();
        assert_eq!((r.read, r.held, r.skipped), (35, 35, 0));
        assert_eq!(restored.shard_lens(), table.shard_lens());
        let (s0, s1) = (table.stats(), restored.stats());
        assert_eq!(
            (s1.inserted, s1.sampled, s1.size, s1.obs_rows),
            (s0.inserted, s0.sampled, s0.size, s0.obs_rows)
        );
        let all = |t: &Table| {
            let mut v = Vec::new();
            t.snapshot(|shard, b| v.push((shard, b)));
            v
        };
        assert_eq!(all(&table), all(&restored));

        // A run with fewer shards takes everything (shards map modulo its count).
        let two = replay_table(2, 1000);
        assert_eq!(restore_replay(&at, &m, &two, 10).unwrap().held, 35);
        // Damage costs what it touches, and the resume goes on with the rest: a file cut
        // short loses its last record, a partial header at the end is counted as lost
        // bytes, a flipped byte inside a record loses that record (its checksum), and a
        // garbage file loses everything but is no error.
        let file = at.join(m.replay_file.as_ref().unwrap());
        let bytes = fs::read(&file).unwrap();
        let restore = || restore_replay(&at, &m, &replay_table(3, 1000), 10).unwrap();
        fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
        let r = restore();
        assert_eq!((r.read, r.damaged), (30, 0), "{r:?}");
        assert!(r.lost_bytes > 0);
        fs::write(&file, [&bytes[..], &[1, 0]].concat()).unwrap();
        assert_eq!((restore().read, restore().lost_bytes), (35, 2));
        let mut flipped = bytes.clone();
        // Inside the second record's payload (12 header bytes, then records).
        let first = 12 + 8 + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        flipped[first + 8 + 40] ^= 0x10;
        fs::write(&file, &flipped).unwrap();
        let r = restore();
        assert_eq!((r.read, r.damaged, r.lost_bytes), (30, 1, 0), "{r:?}");
        assert!(r.losses().unwrap().contains("1 damaged record"));
        fs::write(&file, [0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
        let r = restore();
        assert_eq!((r.read, r.held, r.lost_bytes), (0, 0, 7), "{r:?}");
        // Missing altogether: the networks resume with an empty replay.
        fs::remove_file(&file).unwrap();
        assert_eq!(restore(), super::replay_file::Restored::default());
    }

    #[test]
    fn a_flipped_byte_in_the_model_is_found_not_loaded() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        save_state(
            &dir.path().join("latest"),
            &dqn.state(),
            None,
            meta(&env, &net),
        )
        .unwrap();
        let (m, _, at) = load_state(dir.path()).unwrap();
        assert!(m.model_crc32c.is_some());
        let model = at.join(&m.model_file);
        let mut bytes = fs::read(&model).unwrap();
        // A float's byte, past the safetensors header: it would load as another value.
        let at_byte = bytes.len() - 5;
        bytes[at_byte] ^= 0x01;
        fs::write(&model, &bytes).unwrap();
        let err = load_state(dir.path()).unwrap_err().to_string();
        assert!(err.contains("damaged") && err.contains("checksum"), "{err}");
    }

    #[test]
    fn resuming_into_a_smaller_replay_keeps_what_fits_and_samples_only_that() {
        let (env, net, dqn) = setup();
        let table = replay_table(1, 1000);
        fill(&table);
        let dir = tempfile::tempdir().unwrap();
        save_state(
            &dir.path().join("latest"),
            &dqn.state(),
            Some(&table),
            meta(&env, &net),
        )
        .unwrap();
        let (m, _, at) = load_state(dir.path()).unwrap();
        // Room for two batches of five: the five older ones are evicted as it refills.
        let small = replay_table(1, 10);
        let r = restore_replay(&at, &m, &small, 10).unwrap();
        assert_eq!(r.read, 35, "every batch went in, the oldest were evicted");
        assert_eq!((r.held, small.len()), (10, 10));
        let rewards = sample(&small, 64).expect("10 items: the counters came back");
        assert!(
            rewards.iter().all(|r| *r == 5.0 || *r == 6.0),
            "{rewards:?}"
        );
        // Fewer transitions than learning starts needs: the limiter starts afresh.
        let fresh = replay_table(1, 10);
        restore_replay(&at, &m, &fresh, 1000).unwrap();
        assert_eq!(fresh.stats().inserted, 0, "counters not restored");
        // What counts is what the table holds, not what went through it: 35 read, 10
        // held, learning starts at 20.
        let evicted = replay_table(1, 10);
        restore_replay(&at, &m, &evicted, 20).unwrap();
        assert_eq!(evicted.stats().inserted, 0, "counters not restored");
        assert!(
            sample(&fresh, 8).is_none(),
            "no sampling before learning starts"
        );
    }

    #[test]
    fn policies_are_kept_exactly_and_found_by_name() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        save_state(&layout.latest(), &dqn.state(), None, meta(&env, &net)).unwrap();
        let played: Vec<f32> = (0..net.layout().len).map(|i| i as f32 * 0.5).collect();
        let policy_meta = |which: Which, version| PolicyMeta {
            format: FORMAT_VERSION,
            which,
            policy_file: String::new(),
            env: env.clone(),
            network: net.clone(),
            seed: 0,
            params_version: version,
            env_steps: 100,
            updates: 50,
            eval: record(version, 480.0),
            confirm: (which == Which::Solved).then(|| record(version, 490.0)),
            generation: 0,
        };
        let latest = load_policy(dir.path(), None).unwrap();
        assert_eq!(latest.which, Which::Latest, "only latest/ exists yet");
        assert_eq!(latest.online, dqn.online_params());
        save_policy(&layout.best(), &played, policy_meta(Which::Best, 3)).unwrap();
        save_policy(&layout.best(), &played, policy_meta(Which::Best, 4)).unwrap();
        let best = load_policy(dir.path(), None).unwrap();
        assert_eq!((best.which, best.params_version), (Which::Best, 4));
        assert_eq!(best.online, played, "the exact parameters played");
        assert_eq!(
            fs::read_dir(layout.best()).unwrap().count(),
            2,
            "old file removed"
        );
        let err = load_policy(dir.path(), Some(Which::Solved)).unwrap_err();
        assert!(err.to_string().contains("not solved"), "{err}");
        save_policy(&layout.solved(), &played, policy_meta(Which::Solved, 4)).unwrap();
        let solved = load_policy(&layout.solved(), None).unwrap();
        assert_eq!(solved.which, Which::Solved);
        assert_eq!(solved.confirm.unwrap().mean, 490.0);
    }

    #[test]
    fn mismatched_or_damaged_checkpoints_are_clear_errors() {
        let (env, net, dqn) = setup();
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        save_state(&latest, &dqn.state(), None, meta(&env, &net)).unwrap();
        let (m, _, _) = load_state(dir.path()).unwrap();

        let other_env = millrace_actor::env::spec("Acrobot-v1").unwrap();
        let err = check_fits(&m, &other_env, &net).unwrap_err().to_string();
        assert!(
            err.contains("CartPole-v1") && err.contains("Acrobot-v1"),
            "{err}"
        );
        let bigger = NetworkSpec::mlp(&env.obs, &[32], 2, 1).unwrap();
        assert!(check_fits(&m, &env, &bigger).is_err());

        let model = latest.join(&m.model_file);
        fs::write(&model, b"garbage").unwrap();
        assert!(matches!(
            load_state(dir.path()),
            Err(CheckpointError::Invalid { .. })
        ));
        // Without a recorded checksum (a checkpoint from before there was one), the
        // tensor reader finds garbage too.
        let mut unchecked = m.clone();
        unchecked.model_crc32c = None;
        files::write_json(&latest.join("meta.json"), &unchecked).unwrap();
        assert!(matches!(
            load_state(dir.path()),
            Err(CheckpointError::Tensor { .. })
        ));

        fs::write(latest.join("meta.json"), b"{\"format\": 2}").unwrap();
        assert!(matches!(
            load_state(dir.path()),
            Err(CheckpointError::Invalid { .. })
        ));

        // The flat layout of format 1 is named as such.
        let old = tempfile::tempdir().unwrap();
        fs::write(old.path().join("meta.json"), b"{\"format\": 1}").unwrap();
        let err = load_state(old.path()).unwrap_err().to_string();
        assert!(err.contains("checkpoint format 1"), "{err}");

        let missing = dir.path().join("nope");
        let err = load_state(&missing).unwrap_err().to_string();
        assert!(err.contains("no checkpoint here"), "{err}");
    }
}
