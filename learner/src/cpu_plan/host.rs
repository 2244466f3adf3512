//! Reading the machine the plan starts from (this process's affinity mask, the
//! topology under `/sys/devices/system/cpu`, a cgroup CPU quota) and pinning threads.
//! Linux only; elsewhere every CPU counts as its own core and nothing is pinned.

use std::path::Path;

use super::{Cpu, CpuPlan, Machine};

/// This process's CPUs (its affinity mask), their physical cores, and its cgroup quota.
pub fn machine() -> Machine {
    let ids = affinity().unwrap_or_else(|| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..n).collect()
    });
    let cpus = ids
        .into_iter()
        .map(|id| Cpu {
            id,
            core: core_of(Path::new("/sys/devices/system/cpu"), id),
        })
        .collect();
    Machine {
        cpus,
        quota: quota(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup")),
    }
}

/// `(physical package, core id)` of CPU `id` from sysfs; a core of its own when sysfs
/// does not say.
fn core_of(sys: &Path, id: usize) -> (usize, usize) {
    let topo = sys.join(format!("cpu{id}/topology"));
    let read = |f: &str| -> Option<usize> {
        std::fs::read_to_string(topo.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    match (read("physical_package_id"), read("core_id")) {
        (Some(p), Some(c)) => (p, c),
        _ => (usize::MAX, id),
    }
}

/// The CPUs in this thread's affinity mask.
pub fn affinity() -> Option<Vec<usize>> {
    affinity_of(0)
}

/// The CPUs in thread `tid`'s affinity mask (0: the calling thread).
#[cfg(target_os = "linux")]
pub fn affinity_of(tid: i32) -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set that sched_getaffinity fills;
    // CPU_ISSET reads inside it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let ids: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&i| libc::CPU_ISSET(i, &set))
            .collect();
        (!ids.is_empty()).then_some(ids)
    }
}

#[cfg(not(target_os = "linux"))]
pub fn affinity_of(_tid: i32) -> Option<Vec<usize>> {
    None
}

/// Pins the calling thread (and the threads it starts afterwards, which inherit its
/// mask) to `cpus`; an empty set leaves it as it is.
#[cfg(target_os = "linux")]
pub fn pin(cpus: &[usize]) -> std::io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: as in `affinity`; CPU_SET writes inside the set for ids below
    // CPU_SETSIZE (larger ones are skipped), and sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &id in cpus.iter().filter(|&&id| id < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(id, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn pin(_cpus: &[usize]) -> std::io::Result<()> {
    Ok(())
}

/// Which kind of thread is asking ([`enter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Learner thread `i` (population group thread `i`).
    Learner(usize),
    Service,
    Actor,
}

/// Pins the calling thread where `plan` puts `role`; a failure is logged, not fatal
/// (the thread then runs where it was). Call it first thing in the thread, before any
/// libtorch call: threads libtorch starts (the autograd worker for a CUDA device)
/// inherit the mask.
pub fn enter(plan: &CpuPlan, role: Role) {
    if !plan.pins() {
        return;
    }
    let cpus: &[usize] = match role {
        Role::Learner(i) => match plan.learner.get(i) {
            Some(cpu) => std::slice::from_ref(cpu),
            None => &plan.service,
        },
        Role::Service => &plan.service,
        Role::Actor => &plan.actors,
    };
    if let Err(e) = pin(cpus) {
        tracing::warn!(
            "CPU plan: cannot pin the {role:?} thread to CPU(s) {}: {e}",
            super::list(cpus)
        );
    }
}

/// Puts the calling thread back on the CPUs it had when [`enter_for_now`] moved it.
#[must_use = "the thread is moved back when this is dropped"]
pub struct Restore(Option<Vec<usize>>);

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(mask) = &self.0 {
            let _ = pin(mask);
        }
    }
}

/// [`enter`] until the returned guard is dropped: for a library call (a run) on a
/// thread that goes on afterwards.
pub fn enter_for_now(plan: &CpuPlan, role: Role) -> Restore {
    let before = plan.pins().then(affinity).flatten();
    enter(plan, role);
    Restore(before)
}

/// The cgroup CPU quota of this process, in CPUs: the smallest along its cgroup's path
/// (a parent's quota binds its children: a Slurm job's, a systemd slice's), from cgroup
/// v2's `cpu.max` ("max 100000" for none), else v1's `cpu.cfs_quota_us` /
/// `cpu.cfs_period_us` (-1 for none). The path comes from `/proc/self/cgroup`; a
/// container that sees its own cgroup at the mount's root finds it there.
fn quota(proc_cgroup: &Path, root: &Path) -> Option<f64> {
    let lines = std::fs::read_to_string(proc_cgroup).unwrap_or_default();
    let mut v2 = None;
    let mut v1 = None;
    for line in lines.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "cpu") {
            v1 = Some(path.to_string());
        }
    }
    let v2_quota = |dir: &Path| -> Option<Option<f64>> {
        Some(parse_cpu_max(
            &std::fs::read_to_string(dir.join("cpu.max")).ok()?,
        ))
    };
    let v1_quota = |dir: &Path| -> Option<Option<f64>> {
        let read = |f: &str| -> Option<f64> {
            std::fs::read_to_string(dir.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let (q, p) = (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?);
        Some((q > 0.0 && p > 0.0).then(|| q / p))
    };
    if let Some(found) = smallest_along(root, v2.as_deref().unwrap_or(""), v2_quota) {
        return found;
    }
    for mount in ["cpu", "cpu,cpuacct", "cpuacct,cpu"] {
        let found = smallest_along(&root.join(mount), v1.as_deref().unwrap_or(""), v1_quota);
        if let Some(found) = found {
            return found;
        }
    }
    None
}

/// The smallest quota `read` finds in `root/path` and each of its parents up to
/// `root`: `None` if no directory along it has the file, `Some(None)` if they have it
/// and set no quota.
fn smallest_along(
    root: &Path,
    path: &str,
    read: impl Fn(&Path) -> Option<Option<f64>>,
) -> Option<Option<f64>> {
    let mut dir = root.join(path);
    let mut found: Option<Option<f64>> = None;
    loop {
        if let Some(q) = read(&dir) {
            found = Some(match (found.flatten(), q) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            });
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    found
}

/// `cpu.max`: "QUOTA PERIOD", QUOTA `max` for none.
fn parse_cpu_max(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let (q, p) = (it.next()?, it.next()?);
    let (q, p): (f64, f64) = (q.parse().ok()?, p.parse().ok()?);
    (q > 0.0 && p > 0.0).then(|| q / p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cgroup_v2_and_v1_quotas() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_cg, root) = (dir.path().join("cgroup"), dir.path().join("fs"));
        // v2, the process in /slurm/job1 with 2.5 CPUs.
        std::fs::write(&proc_cg, "0::/slurm/job1\n").unwrap();
        std::fs::create_dir_all(root.join("slurm/job1")).unwrap();
        std::fs::write(root.join("slurm/job1/cpu.max"), "250000 100000\n").unwrap();
        assert_eq!(quota(&proc_cg, &root), Some(2.5));
        std::fs::write(root.join("slurm/job1/cpu.max"), "max 100000\n").unwrap();
        assert_eq!(quota(&proc_cg, &root), None);
        // A parent's quota binds its child's.
        std::fs::write(root.join("slurm/cpu.max"), "150000 100000\n").unwrap();
        std::fs::write(root.join("slurm/job1/cpu.max"), "400000 100000\n").unwrap();
        assert_eq!(quota(&proc_cg, &root), Some(1.5));
        // v1 as a container sees it: its own cgroup at the mount's root.
        let (proc_cg, root) = (dir.path().join("cgroup1"), dir.path().join("fs1"));
        std::fs::write(&proc_cg, "3:cpuset:/\n2:cpu,cpuacct:/docker/abc\n").unwrap();
        std::fs::create_dir_all(root.join("cpu,cpuacct")).unwrap();
        std::fs::write(root.join("cpu,cpuacct/cpu.cfs_quota_us"), "150000\n").unwrap();
        std::fs::write(root.join("cpu,cpuacct/cpu.cfs_period_us"), "100000\n").unwrap();
        assert_eq!(quota(&proc_cg, &root), Some(1.5));
        std::fs::write(root.join("cpu,cpuacct/cpu.cfs_quota_us"), "-1\n").unwrap();
        assert_eq!(quota(&proc_cg, &root), None);
        assert_eq!(
            quota(&dir.path().join("absent"), &dir.path().join("none")),
            None
        );
    }

    #[test]
    fn reads_this_process_mask() {
        let m = machine();
        assert!(!m.cpus.is_empty());
        // The mask read back is the mask set.
        let mine = affinity().unwrap();
        std::thread::spawn(move || {
            pin(&mine[..1]).unwrap();
            assert_eq!(affinity().unwrap(), &mine[..1]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn reads_topology_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let topo = dir.path().join("cpu3/topology");
        std::fs::create_dir_all(&topo).unwrap();
        std::fs::write(topo.join("physical_package_id"), "1\n").unwrap();
        std::fs::write(topo.join("core_id"), "7\n").unwrap();
        assert_eq!(core_of(dir.path(), 3), (1, 7));
        assert_eq!(core_of(dir.path(), 4), (usize::MAX, 4));
    }
}
