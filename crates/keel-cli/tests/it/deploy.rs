//! The files in `deploy/` against the binary they deploy: every YAML file parses; the
//! Kubernetes objects fit together (StatefulSet, headless and client Service, PDB; probes
//! on the container's gRPC port and a service the health service reports; selectors that
//! match the pod labels); and every flag and settings key the files hand `keel serve`
//! (compose commands, flags commented out in them, the Kubernetes entrypoint as it runs, the
//! systemd unit, the TOML settings files and keys commented out in them) is one this
//! `keel serve` accepts, as its `--help` and its settings-file parser say.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_norway::Value;

/// The `keel serve` flags the k8s entrypoint passes when the `keel-tls` and `keel-auth`
/// Secrets are mounted.
const SECRET_FLAGS: &[&str] = &["--tls-cert", "--tls-key", "--tls-ca", "--auth-tokens"];

/// The services `grpc.health.v1` reports (`keel-server/src/health_service.rs`): "" and the
/// public API follow the whole verdict, the Raft service the node's health alone.
const HEALTH_SERVICES: &[&str] = &[
    "",
    "keel.v1.Kv",
    "keel.v1.Lock",
    "keel.v1.Idempotency",
    "keel.v1.Cluster",
    "keel.raft.v1.Raft",
];
/// The one that stays SERVING while a range has no leader: what a liveness probe must ask.
const HEALTH_SERVICE_OF_THE_NODE: &str = "keel.raft.v1.Raft";

/// A key no settings file has: appended last, the parser reaches it only after every other
/// key (tables are read in key order or in file order; it is last either way), so an error
/// that names it means every key before it exists and has a value of the right type.
const SENTINEL_KEY: &str = "zzzz_deploy_test_sentinel";

#[test]
fn deploy_files_are_consistent_and_name_only_real_serve_flags() {
    let binary = Binary::new();
    let mut problems = Problems::default();
    let yaml = yaml_files(&deploy_dir());
    assert!(
        yaml.len() >= 5,
        "expected the compose and k8s files: {yaml:?}"
    );
    let mut kubernetes = Vec::new();
    for path in &yaml {
        let text = std::fs::read_to_string(path).unwrap();
        let documents = parse_yaml(path, &text, &mut problems);
        if path.file_name().is_some_and(|name| name == "compose.yaml") {
            check_compose(&binary, path, &text, &documents, &mut problems);
        } else if documents.iter().any(|document| !document["kind"].is_null()) {
            kubernetes.extend(documents.into_iter().map(|doc| (path.clone(), doc)));
        }
    }
    check_kubernetes(&binary, &kubernetes, &mut problems);
    check_systemd(&binary, &deploy_dir().join("systemd"), &mut problems);
    problems.assert_none();
}

/// The built `keel` and what its `serve` accepts.
struct Binary {
    path: PathBuf,
    /// Every `--flag` `keel serve --help` names (aliases and global options included), and
    /// the pending ones.
    serve_flags: BTreeSet<String>,
    /// Every key the settings file may have, and the pending flags' keys.
    settings_keys: BTreeSet<String>,
}

impl Binary {
    fn new() -> Binary {
        let path = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
        let help = run(Command::new(&path).args(["serve", "--help"]));
        assert!(help.status.success(), "keel serve --help: {help:?}");
        let serve_flags: BTreeSet<String> = flags_in(&stdout(&help)).into_iter().collect();
        assert!(serve_flags.contains("--initial-cluster"), "{serve_flags:?}");
        let mut binary = Binary {
            path,
            serve_flags,
            settings_keys: BTreeSet::new(),
        };
        binary.settings_keys = binary.known_settings_keys();
        binary
    }

    /// The keys `keel serve --config` knows, from its refusal of an unknown one.
    fn known_settings_keys(&self) -> BTreeSet<String> {
        let refusal = self.refusal_of_settings(&format!("{SENTINEL_KEY} = 0\n"));
        let (_, expected) = refusal
            .split_once("expected one of")
            .unwrap_or_else(|| panic!("keel serve did not list its settings keys: {refusal}"));
        let keys: BTreeSet<String> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        assert!(keys.contains("initial_cluster"), "{keys:?}");
        keys
    }

    /// What `keel serve --config FILE` says of a file holding `text`: it must refuse it
    /// before doing anything, which a file with the sentinel key makes sure of.
    fn refusal_of_settings(&self, text: &str) -> String {
        assert!(text.contains(SENTINEL_KEY));
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
        let output = run(Command::new(&self.path)
            .args(["serve", "--config"])
            .arg(file.path()));
        assert!(!output.status.success(), "keel serve took {text:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// The flags of `command` (as `keel cluster status`) that its `--help` does not name.
    fn unknown_flags_of(&self, command: &[&str], flags: &[String]) -> Vec<String> {
        let help = run(Command::new(&self.path).args(command).arg("--help"));
        let known = flags_in(&stdout(&help));
        flags
            .iter()
            .filter(|flag| !known.contains(flag))
            .cloned()
            .collect()
    }
}

/// Problems found, reported all at once.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, origin: &Path, problem: impl std::fmt::Display) {
        let origin = origin.strip_prefix(deploy_dir()).unwrap_or(origin);
        self.0
            .push(format!("deploy/{}: {problem}", origin.display()));
    }

    fn check(&mut self, origin: &Path, holds: bool, problem: impl std::fmt::Display) {
        if !holds {
            self.add(origin, problem);
        }
    }

    /// Every flag of `flags` must be a `keel serve` flag.
    fn serve_flags(&mut self, binary: &Binary, origin: &Path, what: &str, flags: &[String]) {
        for flag in flags {
            if !binary.serve_flags.contains(flag) {
                self.add(
                    origin,
                    format!("{what} passes {flag}, which keel serve does not take"),
                );
            }
        }
    }

    /// `args` (what follows the binary) run `keel serve`, with flags (`--flag` or
    /// `--flag=value`) it takes.
    fn serve_command(&mut self, binary: &Binary, origin: &Path, what: &str, args: &[String]) {
        let serve = args.first().map(String::as_str) == Some("serve");
        self.check(
            origin,
            serve,
            format!("{what} does not run keel serve: {args:?}"),
        );
        let flags: Vec<String> = args
            .iter()
            .filter(|arg| arg.starts_with("--"))
            .map(|arg| arg.split('=').next().unwrap_or(arg).to_string())
            .collect();
        self.serve_flags(binary, origin, what, &flags);
    }

    /// A settings file: every key (and value) as `keel serve --config` reads it, and every
    /// key commented out in it a key it knows.
    fn settings(&mut self, binary: &Binary, origin: &Path, text: &str) {
        let refusal = binary.refusal_of_settings(&format!("{text}\n{SENTINEL_KEY} = 0\n"));
        if !refusal.contains(&format!("unknown field `{SENTINEL_KEY}`")) {
            self.add(origin, format!("keel serve --config refuses it: {refusal}"));
        }
        for key in commented_keys(text) {
            if !binary.settings_keys.contains(&key) {
                self.add(
                    origin,
                    format!("commented-out key {key} is no keel serve setting"),
                );
            }
        }
    }

    fn assert_none(self) {
        assert!(self.0.is_empty(), "\n{}", self.0.join("\n"));
    }
}

fn check_compose(
    binary: &Binary,
    path: &Path,
    text: &str,
    documents: &[Value],
    problems: &mut Problems,
) {
    let [compose] = documents else {
        return problems.add(path, "expected one YAML document");
    };
    let Some(services) = compose["services"].as_mapping() else {
        return problems.add(path, "no services");
    };
    let mut clusters = BTreeSet::new();
    let mut addresses = BTreeSet::new();
    for (name, service) in services {
        let name = name.as_str().unwrap_or_default();
        let command = strings(&service["command"]);
        problems.serve_command(binary, path, &format!("service {name}"), &command);
        let flags = parsed_flags(&command);
        clusters.insert(flags.get("--initial-cluster").cloned().unwrap_or_default());
        let port = flags
            .get("--listen")
            .and_then(|listen| listen.rsplit_once(':'))
            .map(|(_, port)| port.to_string())
            .unwrap_or_default();
        let hostname = service["hostname"].as_str().unwrap_or_default();
        addresses.insert(format!("{hostname}:{port}"));
        check_compose_ports(path, name, service, &flags, problems);
        check_compose_volumes(path, name, compose, service, problems);
        check_compose_healthcheck(binary, path, name, service, problems);
    }
    let commented = commented_yaml_flags(text);
    problems.serve_flags(binary, path, "a commented-out line", &commented);
    check_initial_cluster(path, &clusters, &addresses, problems);
}

/// Every service gives the same `--initial-cluster`, and it names every service's
/// `hostname:listen port`.
fn check_initial_cluster(
    path: &Path,
    clusters: &BTreeSet<String>,
    addresses: &BTreeSet<String>,
    problems: &mut Problems,
) {
    let clusters: Vec<&String> = clusters.iter().collect();
    let [cluster] = clusters.as_slice() else {
        return problems.add(
            path,
            format!("services disagree on --initial-cluster: {clusters:?}"),
        );
    };
    let named: BTreeSet<String> = cluster
        .split(',')
        .filter_map(|entry| entry.split_once('=').map(|(_, addr)| addr.to_string()))
        .collect();
    problems.check(
        path,
        &named == addresses,
        format!("--initial-cluster names {named:?}, the services are {addresses:?}"),
    );
}

/// The gRPC and metrics ports a service listens on are published.
fn check_compose_ports(
    path: &Path,
    name: &str,
    service: &Value,
    flags: &BTreeMap<String, String>,
    problems: &mut Problems,
) {
    let published = strings(&service["ports"]);
    for flag in ["--listen", "--metrics-listen"] {
        let Some((_, port)) = flags.get(flag).and_then(|addr| addr.rsplit_once(':')) else {
            problems.add(path, format!("service {name} has no {flag}"));
            continue;
        };
        let mapped = published
            .iter()
            .any(|mapping| mapping.ends_with(&format!(":{port}")));
        problems.check(
            path,
            mapped,
            format!("service {name} does not publish its {flag} port {port}: {published:?}"),
        );
    }
}

/// The data dir is on a named volume the file declares.
fn check_compose_volumes(
    path: &Path,
    name: &str,
    compose: &Value,
    service: &Value,
    problems: &mut Problems,
) {
    for volume in strings(&service["volumes"]) {
        let source = volume.split(':').next().unwrap_or_default();
        problems.check(
            path,
            compose["volumes"].get(source).is_some(),
            format!("service {name} mounts volume {source}, which is not declared"),
        );
    }
    problems.check(
        path,
        !strings(&service["volumes"]).is_empty(),
        format!("service {name} keeps its data dir on no volume"),
    );
}

/// The health check is a `keel` client command with flags that command takes.
fn check_compose_healthcheck(
    binary: &Binary,
    path: &Path,
    name: &str,
    service: &Value,
    problems: &mut Problems,
) {
    let test = strings(&service["healthcheck"]["test"]);
    let Some(shell) = test
        .last()
        .filter(|_| test.len() == 2 && test[0] == "CMD-SHELL")
    else {
        return problems.add(
            path,
            format!("service {name} has no CMD-SHELL health check"),
        );
    };
    let command = shell.split('|').next().unwrap_or_default();
    let words: Vec<&str> = command.split_whitespace().take(3).collect();
    if words != ["keel", "cluster", "status"] {
        let problem = format!("service {name}: the health check is not keel cluster status");
        return problems.add(path, format!("{problem}: {shell}"));
    }
    let unknown = binary.unknown_flags_of(&words[1..], &flags_in(command));
    problems.check(
        path,
        unknown.is_empty(),
        format!("service {name}: the health check passes {unknown:?}, unknown to keel"),
    );
}

/// The Kubernetes objects of `deploy/k8s`.
struct Objects<'a>(&'a [(PathBuf, Value)]);

impl<'a> Objects<'a> {
    fn of_kind(&self, kind: &str) -> Vec<&'a (PathBuf, Value)> {
        self.0
            .iter()
            .filter(|(_, object)| object["kind"].as_str() == Some(kind))
            .collect()
    }
}

fn check_kubernetes(binary: &Binary, objects: &[(PathBuf, Value)], problems: &mut Problems) {
    let objects = Objects(objects);
    let sets = objects.of_kind("StatefulSet");
    let [(path, set)] = sets.as_slice() else {
        return problems.add(&deploy_dir(), "expected one StatefulSet under k8s/");
    };
    let spec = &set["spec"];
    let pod = &spec["template"];
    let labels = &pod["metadata"]["labels"];
    problems.check(
        path,
        spec["replicas"].as_u64() == Some(3),
        "replicas is not 3",
    );
    problems.check(
        path,
        selects(&spec["selector"]["matchLabels"], labels),
        "the StatefulSet's selector does not match its pod labels",
    );
    let [container] = items(&pod["spec"]["containers"]) else {
        return problems.add(path, "expected one container");
    };
    let ports = container_ports(container);
    check_probes(path, container, &ports, problems);
    check_claims(path, spec, container, problems);
    check_pod(path, pod, problems);
    check_services(&objects, spec, labels, &ports, problems);
    check_budget(&objects, labels, problems);
    check_entrypoint(
        binary,
        &objects,
        (path.as_path(), set),
        container,
        &ports,
        problems,
    );
}

/// Named container ports.
fn container_ports(container: &Value) -> BTreeMap<String, u64> {
    entries(&container["ports"], "name", "containerPort")
        .filter_map(|(name, port)| Some((name, port.as_u64()?)))
        .collect()
}

/// Startup, liveness and readiness probes ask the health service on the gRPC port (a grpc
/// probe takes a number, not a port name); liveness asks the node's own health.
fn check_probes(
    path: &Path,
    container: &Value,
    ports: &BTreeMap<String, u64>,
    problems: &mut Problems,
) {
    let grpc = ports.get("grpc").copied();
    problems.check(path, grpc.is_some(), "the container has no port named grpc");
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let action = &container[probe]["grpc"];
        problems.check(
            path,
            action["port"].as_u64().is_some() && action["port"].as_u64() == grpc,
            format!(
                "{probe} does not ask the gRPC port {grpc:?}: {:?}",
                action["port"]
            ),
        );
        let service = action["service"].as_str().unwrap_or_default();
        problems.check(
            path,
            HEALTH_SERVICES.contains(&service),
            format!("{probe} asks service {service:?}, which the health service does not report"),
        );
    }
    let liveness = container["livenessProbe"]["grpc"]["service"].as_str();
    problems.check(
        path,
        liveness == Some(HEALTH_SERVICE_OF_THE_NODE),
        format!("livenessProbe asks {liveness:?}: it would restart nodes during elections"),
    );
}

/// The data volume comes from a claim template and holds the data dir.
fn check_claims(path: &Path, spec: &Value, container: &Value, problems: &mut Problems) {
    let claims: Vec<&str> = items(&spec["volumeClaimTemplates"])
        .iter()
        .filter_map(|claim| claim["metadata"]["name"].as_str())
        .collect();
    let mounted = mounts(container);
    problems.check(
        path,
        mounted
            .get("/var/lib/keel")
            .is_some_and(|name| claims.contains(&name.as_str())),
        format!("/var/lib/keel is not on a volumeClaimTemplate ({claims:?}; mounts {mounted:?})"),
    );
}

/// Anti-affinity by host, and time for a clean shutdown.
fn check_pod(path: &Path, pod: &Value, problems: &mut Problems) {
    let spec = &pod["spec"];
    let anti = &spec["affinity"]["podAntiAffinity"];
    let terms = [
        &anti["requiredDuringSchedulingIgnoredDuringExecution"],
        &anti["preferredDuringSchedulingIgnoredDuringExecution"],
    ];
    let by_host = terms.iter().any(|term| {
        term.as_sequence().is_some_and(|terms| {
            terms.iter().any(|term| {
                let term = if term["podAffinityTerm"].is_null() {
                    term
                } else {
                    &term["podAffinityTerm"]
                };
                term["topologyKey"].as_str() == Some("kubernetes.io/hostname")
                    && selects(
                        &term["labelSelector"]["matchLabels"],
                        &pod["metadata"]["labels"],
                    )
            })
        })
    });
    problems.check(
        path,
        by_host,
        "no pod anti-affinity by kubernetes.io/hostname",
    );
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    problems.check(
        path,
        grace >= 10,
        format!("terminationGracePeriodSeconds {grace} leaves no time for the 5 s request grace and the flush"),
    );
}

/// The StatefulSet's headless Service (publishing not-ready pods) and a client Service, each
/// selecting the pods and targeting their named ports.
fn check_services(
    objects: &Objects,
    spec: &Value,
    labels: &Value,
    ports: &BTreeMap<String, u64>,
    problems: &mut Problems,
) {
    let services = objects.of_kind("Service");
    let headless = services.iter().find(|(_, service)| {
        spec["serviceName"].as_str().is_some() && service["metadata"]["name"] == spec["serviceName"]
    });
    match headless {
        Some((path, service)) => problems.check(
            path,
            service["spec"]["clusterIP"].as_str() == Some("None")
                && service["spec"]["publishNotReadyAddresses"].as_bool() == Some(true),
            "the StatefulSet's service is not headless with publishNotReadyAddresses: true",
        ),
        None => problems.add(&deploy_dir(), "no Service is the StatefulSet's serviceName"),
    }
    problems.check(
        &deploy_dir(),
        services.len() >= 2,
        "expected a headless and a client Service",
    );
    for (path, service) in services {
        let name = service["metadata"]["name"].as_str().unwrap_or_default();
        problems.check(
            path,
            selects(&service["spec"]["selector"], labels),
            format!("Service {name} does not select the pods"),
        );
        for port in items(&service["spec"]["ports"]) {
            let target = &port["targetPort"];
            let known = match (target.as_str(), target.as_u64()) {
                (Some(name), _) => ports.contains_key(name),
                (None, Some(number)) => ports.values().any(|port| *port == number),
                (None, None) => false,
            };
            problems.check(
                path,
                known,
                format!("Service {name} targets port {target:?}, which the pods do not name"),
            );
        }
    }
}

/// A PodDisruptionBudget of one pod at a time, over the pods.
fn check_budget(objects: &Objects, labels: &Value, problems: &mut Problems) {
    let budgets = objects.of_kind("PodDisruptionBudget");
    let [(path, budget)] = budgets.as_slice() else {
        return problems.add(&deploy_dir(), "expected one PodDisruptionBudget");
    };
    problems.check(
        path,
        budget["spec"]["maxUnavailable"].as_u64() == Some(1),
        "the PodDisruptionBudget does not allow exactly one pod down",
    );
    problems.check(
        path,
        selects(&budget["spec"]["selector"]["matchLabels"], labels),
        "the PodDisruptionBudget does not select the pods",
    );
}

/// The names a pod of the StatefulSet has, in namespace `test`.
struct PodNames {
    set: String,
    service: String,
    domain: String,
    port: u64,
}

impl PodNames {
    /// The address of pod ORDINAL: its stable DNS name and the gRPC port.
    fn addr(&self, ordinal: u64) -> String {
        let PodNames {
            set,
            service,
            domain,
            port,
        } = self;
        format!("{set}-{ordinal}.{service}.test.svc.{domain}:{port}")
    }
}

/// The container runs a script of a ConfigMap it mounts. Run for the first pod and for a
/// pod past the initial cluster (with the TLS and auth files there), with a stand-in
/// `keel` that prints its arguments, the script must start `keel serve` as node ordinal + 1
/// with only flags `keel serve` takes; its `--config` file is checked as a settings file.
fn check_entrypoint(
    binary: &Binary,
    objects: &Objects,
    (path, set): (&Path, &Value),
    container: &Value,
    ports: &BTreeMap<String, u64>,
    problems: &mut Problems,
) {
    let pod = &set["spec"]["template"];
    let command = strings(&container["command"]);
    let (Some(shell), Some(script_path)) = (command.first(), command.get(1)) else {
        return problems.add(
            path,
            format!("the container command is not SHELL SCRIPT: {command:?}"),
        );
    };
    let Some((origin, script)) = mounted_file(objects, pod, container, script_path) else {
        return problems.add(
            path,
            format!("{script_path} is no key of a mounted ConfigMap"),
        );
    };
    problems.serve_flags(binary, &origin, "the entrypoint", &flags_in(&script));
    for secret in ["keel-tls", "keel-auth"] {
        let mount = secret_mount(pod, container, secret).unwrap_or_default();
        problems.check(
            &origin,
            !mount.is_empty() && script.contains(&mount),
            format!("Secret {secret} is mounted at {mount:?}, where the entrypoint does not look"),
        );
    }
    let env = container_env(container);
    let names = PodNames {
        set: set["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        service: set["spec"]["serviceName"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        domain: env
            .get("KEEL_CLUSTER_DOMAIN")
            .cloned()
            .unwrap_or_else(|| "cluster.local".into()),
        port: ports.get("grpc").copied().unwrap_or_default(),
    };
    problems.check(
        path,
        env.get("KEEL_PEER_SERVICE") == Some(&names.service),
        format!(
            "KEEL_PEER_SERVICE is not the StatefulSet's serviceName {}",
            names.service
        ),
    );
    let initial = env
        .get("KEEL_INITIAL_NODES")
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(3);
    let mut configs = BTreeSet::new();
    for ordinal in [0, initial] {
        let args = run_entrypoint(shell, &script, &env, &names, ordinal);
        check_entrypoint_args(binary, &origin, &args, &names, (ordinal, initial), problems);
        configs.insert(flag_value(&args, "--config").unwrap_or_default());
    }
    for config in configs {
        match mounted_file(objects, pod, container, &config) {
            Some((origin, settings)) => problems.settings(binary, &origin, &settings),
            None => problems.add(
                &origin,
                format!("--config {config:?} is no key of a mounted ConfigMap"),
            ),
        }
    }
}

/// The arguments of pod ORDINAL: `serve`, its node id and address, the initial cluster or
/// the nodes to join, the TLS and auth flags when their files are there.
fn check_entrypoint_args(
    binary: &Binary,
    origin: &Path,
    args: &[String],
    names: &PodNames,
    (ordinal, initial): (u64, u64),
    problems: &mut Problems,
) {
    let what = format!("the entrypoint of pod {}-{ordinal}", names.set);
    problems.serve_command(binary, origin, &what, args);
    problems.check(
        origin,
        flag_value(args, "--node-id") == Some((ordinal + 1).to_string()),
        format!("{what} is not node {}: {args:?}", ordinal + 1),
    );
    let own = names.addr(ordinal);
    problems.check(
        origin,
        flag_value(args, "--advertise").as_ref() == Some(&own),
        format!("{what} does not advertise {own}: {args:?}"),
    );
    let expected = if ordinal < initial {
        let cluster = (0..initial).map(|i| format!("{}={}", i + 1, names.addr(i)));
        ("--initial-cluster", cluster.collect::<Vec<_>>().join(","))
    } else {
        let seeds = (0..initial).map(|i| names.addr(i));
        ("--join", seeds.collect::<Vec<_>>().join(","))
    };
    problems.check(
        origin,
        flag_value(args, expected.0).as_ref() == Some(&expected.1),
        format!(
            "{what} does not pass {} {}: {args:?}",
            expected.0, expected.1
        ),
    );
    if ordinal >= initial {
        for flag in SECRET_FLAGS {
            problems.check(
                origin,
                args.iter().any(|arg| arg == flag),
                format!("{what} with the keel-tls and keel-auth files does not pass {flag}"),
            );
        }
    }
}

/// The arguments the entrypoint hands `keel` in pod ORDINAL; for a pod past the first,
/// with TLS and auth files in place.
fn run_entrypoint(
    shell: &str,
    script: &str,
    env: &BTreeMap<String, String>,
    names: &PodNames,
    ordinal: u64,
) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let stub = dir.path().join("keel");
    std::fs::write(
        &stub,
        "#!/bin/sh\nfor arg in \"$@\"; do printf '%s\\n' \"$arg\"; done\n",
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script_file = dir.path().join("entrypoint.sh");
    std::fs::write(&script_file, script).unwrap();
    for (sub, file) in [("tls", "tls.crt"), ("auth", "tokens.toml")] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
        if ordinal > 0 {
            std::fs::write(dir.path().join(sub).join(file), "").unwrap();
        }
    }
    let path = format!("{}:/usr/bin:/bin", dir.path().display());
    let output = run(Command::new(shell)
        .arg(&script_file)
        .env_clear()
        .envs(env)
        .env("PATH", path)
        .env("HOSTNAME", format!("{}-{ordinal}", names.set))
        .env("POD_NAMESPACE", "test")
        .env("KEEL_TLS_DIR", dir.path().join("tls"))
        .env("KEEL_AUTH_DIR", dir.path().join("auth")));
    assert!(output.status.success(), "the entrypoint failed: {output:?}");
    stdout(&output).lines().map(str::to_string).collect()
}

/// The container's plain `env` values (not those from the downward API).
fn container_env(container: &Value) -> BTreeMap<String, String> {
    entries(&container["env"], "name", "value")
        .filter_map(|(name, value)| Some((name, value.as_str()?.to_string())))
        .collect()
}

/// Mount path -> volume name of the container.
fn mounts(container: &Value) -> BTreeMap<String, String> {
    entries(&container["volumeMounts"], "mountPath", "name")
        .filter_map(|(path, name)| Some((path, name.as_str()?.to_string())))
        .collect()
}

/// The (`key` as a string, `value`) of each mapping in the list `list` that has both.
fn entries<'a>(
    list: &'a Value,
    key: &str,
    value: &str,
) -> impl Iterator<Item = (String, &'a Value)> {
    items(list).iter().filter_map(move |entry| {
        let value = entry.get(value)?;
        Some((entry.get(key)?.as_str()?.to_string(), value))
    })
}

/// The items of a YAML list; none when `value` is no list.
fn items(value: &Value) -> &[Value] {
    value.as_sequence().map_or(&[][..], Vec::as_slice)
}

/// Where the container mounts the volume of Secret `secret`.
fn secret_mount(pod: &Value, container: &Value, secret: &str) -> Option<String> {
    let volumes = pod["spec"]["volumes"].as_sequence()?;
    let volume = volumes
        .iter()
        .find(|volume| volume["secret"]["secretName"].as_str() == Some(secret))?;
    let name = volume["name"].as_str()?;
    let (path, _) = mounts(container)
        .into_iter()
        .find(|(_, mounted)| mounted == name)?;
    Some(path)
}

/// The file at `file` in the container, when it is a key of a ConfigMap the pod mounts:
/// (an origin naming the ConfigMap, the file's text).
fn mounted_file(
    objects: &Objects,
    pod: &Value,
    container: &Value,
    file: &str,
) -> Option<(PathBuf, String)> {
    let (dir, key) = file.rsplit_once('/')?;
    let volume_name = mounts(container).get(dir)?.clone();
    let volumes = pod["spec"]["volumes"].as_sequence()?;
    let volume = volumes
        .iter()
        .find(|v| v["name"].as_str() == Some(volume_name.as_str()))?;
    let map_name = volume["configMap"]["name"].as_str()?;
    let (path, map) = objects
        .of_kind("ConfigMap")
        .into_iter()
        .find(|(_, map)| map["metadata"]["name"].as_str() == Some(map_name))?;
    let text = map["data"][key].as_str()?;
    Some((path.join(key), text.to_string()))
}

/// Whether `selector` (label -> value) picks pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(selector) = selector
        .as_mapping()
        .filter(|selector| !selector.is_empty())
    else {
        return false;
    };
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// The unit's `ExecStart` runs `keel serve` with flags it takes, and the settings file it
/// names is checked as one; so is every `.toml` beside the unit.
fn check_systemd(binary: &Binary, dir: &Path, problems: &mut Problems) {
    let unit_path = dir.join("keel.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let exec: Vec<&str> = unit
        .lines()
        .filter_map(|line| line.strip_prefix("ExecStart="))
        .collect();
    let [exec] = exec.as_slice() else {
        return problems.add(&unit_path, "expected one ExecStart=");
    };
    let words: Vec<String> = exec.split_whitespace().map(str::to_string).collect();
    let args = words.get(1..).unwrap_or_default();
    problems.serve_command(binary, &unit_path, "ExecStart", args);
    let config = flag_value(&words, "--config").unwrap_or_default();
    problems.check(
        &unit_path,
        config == "/etc/keel/keel.toml",
        format!("ExecStart reads {config:?}, not /etc/keel/keel.toml"),
    );
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            problems.settings(binary, &path, &text);
        }
    }
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .canonicalize()
        .expect("deploy/ at the top of the repository")
}

/// Every `.yaml` and `.yml` file under `dir`, in order.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
        {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The documents of a YAML file (split at `---` lines), with merge keys applied.
fn parse_yaml(path: &Path, text: &str, problems: &mut Problems) -> Vec<Value> {
    let mut documents = Vec::new();
    let mut current = String::new();
    for line in text.lines().chain(["---"]) {
        if line.trim_end() != "---" {
            current.push_str(line);
            current.push('\n');
            continue;
        }
        match serde_norway::from_str::<Value>(&current) {
            Ok(Value::Null) => {}
            Ok(mut document) => match document.apply_merge() {
                Ok(()) => documents.push(document),
                Err(error) => problems.add(path, format!("merge keys: {error}")),
            },
            Err(error) => problems.add(path, format!("does not parse: {error}")),
        }
        current.clear();
    }
    documents
}

/// A string or a list of strings (a compose `command`, `ports`, `volumes`).
fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(text) => vec![text.clone()],
        Value::Sequence(items) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(text) => Some(text.clone()),
                Value::Number(number) => Some(number.to_string()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// `--flag=value` and `--flag value` arguments as flag -> value ("" for a flag alone).
fn parsed_flags(args: &[String]) -> BTreeMap<String, String> {
    let mut flags = BTreeMap::new();
    let mut args = args.iter().peekable();
    while let Some(arg) = args.next() {
        if !arg.starts_with("--") {
            continue;
        }
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_string(), value.to_string()),
            None => match args.next_if(|next| !next.starts_with("--")) {
                Some(value) => (arg.clone(), value.clone()),
                None => (arg.clone(), String::new()),
            },
        };
        flags.insert(flag, value);
    }
    flags
}

/// The value after `flag` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let at = args.iter().position(|arg| arg == flag)?;
    args.get(at + 1).cloned()
}

/// Every `--name` in `text` (a letter, then letters, digits and dashes).
fn flags_in(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    for (at, _) in text.match_indices("--") {
        let rest = &text[at + 2..];
        if at > 0 && text[..at].ends_with('-') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.push(format!("--{}", name.trim_end_matches('-')));
        }
    }
    flags
}

/// Flags of YAML list items commented out (`# - --flag=value`): ones an operator turns on.
fn commented_yaml_flags(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.trim_start().strip_prefix('#'))
        .filter_map(|comment| comment.trim_start().strip_prefix("- "))
        .filter(|item| item.starts_with("--"))
        .flat_map(flags_in)
        .collect()
}

/// Keys of settings commented out (`# key = value`): ones an operator turns on.
fn commented_keys(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.trim_start().strip_prefix('#'))
        .filter_map(|comment| {
            let (key, _) = comment.trim().split_once(" = ")?;
            let is_key = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            is_key.then(|| key.to_string())
        })
        .collect()
}

fn run(command: &mut Command) -> std::process::Output {
    command.output().expect("running a command")
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn flag_and_key_scanners_find_what_an_operator_would_turn_on() {
    assert_eq!(
        flags_in("keel serve --node-id 1 --listen=0.0.0.0:7001 -- x ---y --tls-ca"),
        ["--node-id", "--listen", "--tls-ca"]
    );
    let compose =
        "    # - --tls-cert=/run/secrets/a\n    # TLS: see --not-this\n    - --node-id=1\n";
    assert_eq!(commented_yaml_flags(compose), ["--tls-cert"]);
    let toml = "# join = \"a:1\"\n# The address = prose\n#tls_ca = \"/ca\"\nlisten = \"x\"\n";
    assert_eq!(commented_keys(toml), ["join", "tls_ca"]);
    let args: Vec<String> = ["serve", "--node-id", "1", "--listen=a:1", "--flag"]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
    let parsed = parsed_flags(&args);
    assert_eq!(parsed["--node-id"], "1");
    assert_eq!(parsed["--listen"], "a:1");
    assert_eq!(parsed["--flag"], "");
}
