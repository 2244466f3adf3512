//! `deploy/` held against the binaries it runs: the Kubernetes manifests (validated as
//! Kubernetes objects by kubernetes-validate against the published schemas, through
//! `scripts/check_k8s.py`) and the docker-compose file (as `docker-compose config`
//! resolves it). Every command line, health probe included, is parsed by the binaries'
//! own flag parsers; ports, the token's path, the volumes, the learner's address as
//! actors dial it and the image names must agree with each other and with
//! `deploy/build.sh`. No cluster is needed (none was available to apply them to); the
//! cluster itself is brought up by `tests/tests/compose_cluster.rs`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use millrace_tests::venv_python;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The images `deploy/build.sh` makes (its `learner_image TAG`, `actor_image TAG` and
/// `docker_build TAG` lines).
fn built_images() -> BTreeSet<String> {
    let script = std::fs::read_to_string(repo().join("deploy/build.sh")).unwrap();
    let images: BTreeSet<String> = script
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let verb = words.next()?;
            let tag = words.next()?;
            (["learner_image", "actor_image", "docker_build"].contains(&verb)
                && tag.starts_with("millrace/"))
            .then(|| tag.to_string())
        })
        .collect();
    assert!(images.contains("millrace/learner:cpu"), "{images:?}");
    images
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| match s {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

fn learner_args(argv: &[String]) -> millrace_learner::cli::Args {
    millrace_learner::cli::Args::try_parse_from(
        std::iter::once("learner".to_string()).chain(argv.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the learner refuses {argv:?}:\n{e}"))
}

fn actor_args(argv: &[String]) -> millrace_actor::cli::Args {
    millrace_actor::cli::Args::try_parse_from(
        std::iter::once("actor".to_string()).chain(argv.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the actor refuses {argv:?}:\n{e}"))
}

/// A health probe's command (`millrace-health ...`, or `learner health ...` / `actor
/// health ...`): the port it asks, and whether it asks for liveness only.
fn probe(command: &[String]) -> (u16, bool) {
    let (bin, rest) = command.split_first().expect("a probe command");
    let health = match bin.as_str() {
        "millrace-health" => {
            millrace_telemetry::Probe::try_parse_from(command)
                .unwrap_or_else(|e| panic!("millrace-health refuses {command:?}:\n{e}"))
                .health
        }
        "learner" => match learner_args(rest).command {
            Some(millrace_learner::cli::Command::Health(h)) => h,
            other => panic!("{command:?} is not `learner health`: {other:?}"),
        },
        "actor" => match actor_args(rest).command {
            Some(millrace_actor::cli::Command::Health(h)) => h,
            other => panic!("{command:?} is not `actor health`: {other:?}"),
        },
        other => panic!("{command:?}: {other} is not on the images' PATH"),
    };
    let addr: SocketAddr = health.metrics_addr.parse().unwrap();
    assert!(
        addr.ip().is_loopback(),
        "{command:?}: probes run inside the container"
    );
    (addr.port(), health.live)
}

/// A probe runs a binary every image has on its PATH: `millrace-health`, which
/// deploy/stage.sh puts beside the learner and the actor (or those two themselves).
fn check_probe_binary(command: &[String]) {
    if command[0] == "millrace-health" {
        let script = std::fs::read_to_string(repo().join("deploy/stage.sh")).unwrap();
        assert!(
            script.contains("\"$dir/bin/millrace-health\""),
            "deploy/stage.sh does not put millrace-health in the images"
        );
    }
}

/// Environment variables the binaries read.
const KNOWN_ENV: &[&str] = &["RUST_LOG", "MILLRACE_TOKEN"];

fn validated_k8s_objects() -> Vec<Value> {
    validated("deploy/k8s")
}

/// The objects of a kustomization folder, validated by `scripts/check_k8s.py`.
fn validated(folder: &str) -> Vec<Value> {
    let out = Command::new(venv_python())
        .arg(repo().join("scripts/check_k8s.py"))
        .arg(repo().join(folder))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{folder} is not valid Kubernetes:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("{folder} validated against Kubernetes {}", v["version"]);
    v["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["object"].clone())
        .collect()
}

fn kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} expected");
    found[0]
}

/// A container's port by name.
fn port(container: &Value, name: &str) -> u16 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no port {name} in {}", container["ports"])) as u16
}

/// Where a pod mounts the volume that comes from `source` (`secret`,
/// `persistentVolumeClaim`).
fn mount(pod: &Value, container: &Value, source: &str) -> PathBuf {
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v.get(source).is_some())
        .unwrap_or_else(|| panic!("no {source} volume"));
    let m = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap_or_else(|| panic!("volume {} not mounted", volume["name"]));
    PathBuf::from(m["mountPath"].as_str().unwrap())
}

fn check_env(container: &Value) {
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        assert!(KNOWN_ENV.contains(&name), "{name}: no binary reads it");
    }
}

fn check_labels_select(selector: &Value, labels: &Value) {
    for (k, v) in selector.as_object().unwrap() {
        assert_eq!(
            &labels[k], v,
            "the selector {selector} misses the pods {labels}"
        );
    }
}

#[test]
fn kubernetes_manifests_are_valid_and_agree_with_the_binaries() {
    let objects = validated_k8s_objects();
    let images = built_images();

    // The learner Job.
    let job = kind(&objects, "Job");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(
        pod["restartPolicy"], "OnFailure",
        "a failed learner restarts"
    );
    let learner = &pod["containers"][0];
    let image = learner["image"].as_str().unwrap();
    assert!(
        images.contains(image),
        "{image} is not built by deploy/build.sh: {images:?}"
    );
    assert_eq!(
        image, "millrace/learner:cuda",
        "the GPU request needs the CUDA image"
    );
    assert_eq!(learner["resources"]["requests"]["nvidia.com/gpu"], "1");
    let args = learner_args(&strings(&learner["args"]));
    assert!(args.command.is_none(), "the Job trains");
    let t = &args.train;
    assert!(t.resume_if_present, "a restarted learner continues its run");
    let listen = t.listen.expect("--listen");
    assert!(
        listen.ip().is_unspecified(),
        "actors reach it from other pods"
    );
    assert_eq!(listen.port(), port(learner, "actors"));
    let metrics = t.metrics_addr.expect("--metrics-addr");
    assert_eq!(metrics.port(), port(learner, "metrics"));
    let secret = mount(pod, learner, "secret");
    assert_eq!(
        t.token_file.as_deref(),
        Some(secret.join("token").as_path())
    );
    let runs = mount(pod, learner, "persistentVolumeClaim");
    let logdir = t.logdir.as_ref().expect("--logdir");
    assert!(
        logdir.starts_with(&runs),
        "{logdir:?} is not on the volume {runs:?}"
    );
    assert!(
        t.checkpoint_every_s.is_some(),
        "periodic checkpoints bound what a crash loses"
    );
    for (which, live) in [("readinessProbe", false), ("livenessProbe", true)] {
        let command = strings(&learner[which]["exec"]["command"]);
        check_probe_binary(&command);
        assert_eq!(probe(&command), (metrics.port(), live), "{which}");
    }
    check_env(learner);
    let claim = &pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v.get("persistentVolumeClaim").is_some())
        .unwrap()["persistentVolumeClaim"]["claimName"];
    assert_eq!(
        &kind(&objects, "PersistentVolumeClaim")["metadata"]["name"],
        claim
    );

    // The Service in front of it.
    let service = kind(&objects, "Service");
    check_labels_select(
        &service["spec"]["selector"],
        &job["spec"]["template"]["metadata"]["labels"],
    );
    let service_port = |name: &str| {
        let p = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("the Service has no port {name}"));
        assert_eq!(
            p["targetPort"], name,
            "the Service forwards to the named port"
        );
        p["port"].as_u64().unwrap() as u16
    };
    let actors_port = service_port("actors");
    service_port("metrics");

    // The NetworkPolicy: it selects the learner's pod, and its actor port admits the
    // actors' pods alone.
    let policy = kind(&objects, "NetworkPolicy");
    check_labels_select(
        &policy["spec"]["podSelector"]["matchLabels"],
        &job["spec"]["template"]["metadata"]["labels"],
    );
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    let actors_rule = rules
        .iter()
        .find(|r| r["ports"][0]["port"] == "actors")
        .expect("a rule for the actor port");
    let from = actors_rule["from"].as_array().unwrap();
    assert_eq!(from.len(), 1, "only the actors reach the actor port");
    let deployment_labels = &kind(&objects, "Deployment")["spec"]["template"]["metadata"]["labels"];
    check_labels_select(&from[0]["podSelector"]["matchLabels"], deployment_labels);

    // The actors.
    let deployment = kind(&objects, "Deployment");
    check_labels_select(
        &deployment["spec"]["selector"]["matchLabels"],
        &deployment["spec"]["template"]["metadata"]["labels"],
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let actor = &pod["containers"][0];
    let image = actor["image"].as_str().unwrap();
    assert!(
        images.contains(image),
        "{image} is not built by deploy/build.sh: {images:?}"
    );
    let args = actor_args(&strings(&actor["args"]));
    assert!(args.command.is_none());
    let service_name = service["metadata"]["name"].as_str().unwrap();
    assert_eq!(
        args.learner,
        format!("{service_name}:{actors_port}"),
        "actors dial the Service"
    );
    let metrics = args.metrics_addr.expect("--metrics-addr");
    assert_eq!(metrics.port(), port(actor, "metrics"));
    let secret = mount(pod, actor, "secret");
    assert_eq!(
        args.token_file.as_deref(),
        Some(secret.join("token").as_path())
    );
    for (which, live) in [("readinessProbe", false), ("livenessProbe", true)] {
        let command = strings(&actor[which]["exec"]["command"]);
        check_probe_binary(&command);
        assert_eq!(probe(&command), (metrics.port(), live), "{which}");
    }
    check_env(actor);
    assert!(
        actor["resources"]["requests"]["cpu"].is_string(),
        "actors request CPU"
    );
    // Both mount the same Secret.
    let secret_of = |pod: &Value| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|v| v["secret"]["secretName"].as_str().map(str::to_string))
            .unwrap()
    };
    assert_eq!(secret_of(pod), secret_of(&job["spec"]["template"]["spec"]));
}

/// The sweep as a Kubernetes Indexed Job (deploy/k8s/sweep) and its merge
/// (deploy/k8s/sweep-merge): pod I's arguments, with `$(JOB_COMPLETION_INDEX)` expanded
/// as Kubernetes expands it, are the learner's `--shard I/N` with N the Job's
/// completions; every pod writes under one log directory on a ReadWriteMany volume, and
/// the merge reads that directory from the same claim.
#[test]
fn the_sweep_indexed_job_and_its_merge_agree_with_the_binaries() {
    let objects = validated("deploy/k8s/sweep");
    let images = built_images();
    let job = kind(&objects, "Job");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let n = spec["completions"].as_u64().unwrap() as usize;
    assert_eq!(
        spec["parallelism"].as_u64(),
        Some(n as u64),
        "all shards at once"
    );
    let pod = &spec["template"]["spec"];
    let shard = &pod["containers"][0];
    let image = shard["image"].as_str().unwrap();
    assert!(
        images.contains(image),
        "{image} is not built by deploy/build.sh"
    );
    let argv = strings(&shard["args"]);
    let runs = mount(pod, shard, "persistentVolumeClaim");
    let mut roots = BTreeSet::new();
    for index in 0..n {
        let expanded: Vec<String> = argv
            .iter()
            .map(|a| a.replace("$(JOB_COMPLETION_INDEX)", &index.to_string()))
            .collect();
        let t = learner_args(&expanded).train;
        let s = t.shard.expect("--shard");
        assert_eq!((s.index, s.count), (index, n), "pod {index}'s shard");
        assert!(t.sweep.is_some() && t.resume_if_present, "{expanded:?}");
        assert!(
            t.max_concurrent_agents.is_some(),
            "the places are given, not left to each node's memory"
        );
        let logdir = t.logdir.expect("--logdir");
        assert!(logdir.starts_with(&runs), "{logdir:?} is not on the volume");
        roots.insert(logdir);
        let file = t.sweep.unwrap();
        let config = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v.get("configMap").is_some())
            .expect("the sweep file's ConfigMap");
        let mounted = shard["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == config["name"])
            .expect("the ConfigMap mounted");
        assert_eq!(
            file.parent(),
            Some(Path::new(mounted["mountPath"].as_str().unwrap()))
        );
    }
    assert_eq!(
        roots.len(),
        1,
        "one log directory for the shards: {roots:?}"
    );
    check_env(shard);
    let claim = kind(&objects, "PersistentVolumeClaim");
    assert_eq!(
        claim["spec"]["accessModes"][0], "ReadWriteMany",
        "pods on many nodes"
    );
    let claim_of = |pod: &Value| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|v| {
                v["persistentVolumeClaim"]["claimName"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap()
    };
    assert_eq!(claim["metadata"]["name"].as_str().unwrap(), claim_of(pod));

    let merge = validated("deploy/k8s/sweep-merge");
    let job = kind(&merge, "Job");
    let pod = &job["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert!(images.contains(container["image"].as_str().unwrap()));
    match learner_args(&strings(&container["args"])).command {
        Some(millrace_learner::cli::Command::Merge { logdir }) => {
            assert!(
                roots.contains(&logdir),
                "merges {logdir:?}, shards write {roots:?}"
            );
            assert!(logdir.starts_with(mount(pod, container, "persistentVolumeClaim")));
        }
        other => panic!("the merge Job runs {other:?}"),
    }
    assert_eq!(claim_of(pod), claim_of(&spec["template"]["spec"]));
    check_env(container);
}

/// `docker-compose config` on deploy/docker-compose.yml (variables at their defaults),
/// as JSON.
fn compose_config(files: &[&str]) -> Value {
    let mut cmd = Command::new("docker-compose");
    for f in files {
        cmd.arg("-f").arg(repo().join("deploy").join(f));
    }
    let out = cmd
        .arg("config")
        .env("MILLRACE_TOKEN_FILE", "/dev/null")
        .output()
        .unwrap_or_else(|e| panic!("docker-compose: {e}"));
    assert!(
        out.status.success(),
        "docker-compose rejects {files:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut py = Command::new(venv_python())
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(py.stdin.as_mut().unwrap(), &out.stdout).unwrap();
    let json = py.wait_with_output().unwrap();
    assert!(json.status.success());
    serde_json::from_slice(&json.stdout).unwrap()
}

/// A compose `command:` string as compose splits it (no quoting is used in ours).
fn words(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
        other => strings(other),
    }
}

#[test]
#[ignore = "needs docker-compose; scripts/test.sh runs it where docker-compose is installed"]
fn the_compose_file_agrees_with_the_binaries() {
    let c = compose_config(&["docker-compose.yml"]);
    let images = built_images();
    let learner = &c["services"]["learner"];
    let actor = &c["services"]["actor"];
    for s in [learner, actor] {
        let image = s["image"].as_str().unwrap();
        assert!(
            images.contains(image),
            "{image} is not built by deploy/build.sh"
        );
        assert_eq!(s["init"], true, "signals reach the process");
        assert_eq!(
            s["restart"], "on-failure:5",
            "crashes restart, finished runs do not, permanent errors do not loop"
        );
        for k in s["environment"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            assert!(KNOWN_ENV.contains(&k.as_str()), "{k}: no binary reads it");
        }
    }
    let secret_path = |s: &Value| {
        let name = s["secrets"][0]["source"].as_str().unwrap().to_string();
        PathBuf::from("/run/secrets").join(name)
    };

    let args = learner_args(&words(&learner["command"]));
    let t = &args.train;
    assert!(t.resume_if_present);
    assert_eq!(
        t.token_file.as_deref(),
        Some(secret_path(learner).as_path())
    );
    let listen = t.listen.unwrap();
    assert!(listen.ip().is_unspecified());
    let metrics = t.metrics_addr.unwrap();
    // docker-compose 1.x prints the short syntax (`runs:/runs:rw`,
    // `127.0.0.1:9100:9100/tcp`), newer ones the long one.
    let volume = &learner["volumes"][0];
    let volume = volume["target"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            volume
                .as_str()
                .and_then(|v| v.split(':').nth(1))
                .map(str::to_string)
        })
        .unwrap();
    assert!(
        t.logdir.as_ref().unwrap().starts_with(&volume),
        "the run is kept in the volume"
    );
    let published = &learner["ports"][0];
    let target = published["target"].as_u64().or_else(|| {
        let short = published.as_str()?;
        short.split('/').next()?.rsplit(':').next()?.parse().ok()
    });
    assert_eq!(
        target,
        Some(u64::from(metrics.port())),
        "the metrics port is published"
    );
    let test = strings(&learner["healthcheck"]["test"]);
    assert_eq!(test[0], "CMD");
    check_probe_binary(&test[1..]);
    assert_eq!(probe(&test[1..]), (metrics.port(), false));

    let a = actor_args(&words(&actor["command"]));
    assert_eq!(
        a.learner,
        format!("learner:{}", listen.port()),
        "actors dial the learner service"
    );
    assert_eq!(a.token_file.as_deref(), Some(secret_path(actor).as_path()));
    let test = strings(&actor["healthcheck"]["test"]);
    check_probe_binary(&test[1..]);
    assert_eq!(probe(&test[1..]), (a.metrics_addr.unwrap().port(), false));
    assert_eq!(
        actor["depends_on"]["learner"]["condition"],
        "service_healthy"
    );

    // The GPU override gives the learner a device and the CUDA image.
    let gpu = compose_config(&["docker-compose.yml", "docker-compose.gpu.yml"]);
    let l = &gpu["services"]["learner"];
    assert_eq!(l["image"], "millrace/learner:cuda");
    assert!(images.contains("millrace/learner:cuda"));
    let devices = &l["deploy"]["resources"]["reservations"]["devices"][0];
    assert_eq!(devices["capabilities"][0], "gpu");
}
