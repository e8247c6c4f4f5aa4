//! A fleet reached over mutual TLS, as behind a mesh's sidecars: each pod sits behind a
//! TLS-terminating listener (a second Envoy here) that requires a client certificate from the
//! test's CA. The gateway, rendered with the CA, the pods' name (SNI, checked against their
//! certificate) and a client certificate, routes by prefix and polls the pods through TLS.
//! Certificates are made in the test with `openssl`. Without the client certificate the
//! handshake fails and the pods are marked down.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use test_harness::cluster::{client, run_dir, start_envoy, start_pods_of, Envoy, PodKind};
use test_harness::envoy_config::PodTls;
use test_harness::fleet::{Answer, ZERO_COST};
use test_harness::paths;
use test_harness::process::{free_port, wait_until, Proc};

const NAME: &str = "pods.prefix-router.test";

/// One Envoy terminating mutual TLS in front of each pod (a listener per pod, plain TCP on to
/// it): what a mesh sidecar does.
fn sidecars(dir: &Path, pods: &[String]) -> (Proc, Vec<String>) {
    let d = |f: &str| dir.join(f).display().to_string();
    let mut listeners = String::new();
    let mut fronts = Vec::new();
    for i in 0..pods.len() {
        let port = free_port().unwrap();
        fronts.push(format!("127.0.0.1:{port}"));
        listeners += &format!(
            r#"
  - name: tls_{i}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_certificates:
            - certificate_chain: {{ filename: "{crt}" }}
              private_key: {{ filename: "{key}" }}
            validation_context:
              trusted_ca: {{ filename: "{ca}" }}
      filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: tls_{i}
          cluster: pod_{i}
"#,
            crt = d("server.crt"),
            key = d("server.key"),
            ca = d("ca.crt"),
        );
    }
    let mut clusters = String::new();
    for (i, pod) in pods.iter().enumerate() {
        let (host, port) = pod.rsplit_once(':').unwrap();
        clusters += &format!(
            r#"
  - name: pod_{i}
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: pod_{i}
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}
"#
        );
    }
    let admin = free_port().unwrap();
    let yaml = format!(
        "admin:\n  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}\nstatic_resources:\n  listeners:{listeners}\n  clusters:{clusters}"
    );
    let path = dir.join("sidecars.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut cmd = Command::new(paths::envoy_bin());
    cmd.arg("-c").arg(&path).args([
        "--concurrency",
        "1",
        "--disable-hot-restart",
        "--log-level",
        "warn",
    ]);
    let mut proc = Proc::spawn("sidecars", cmd, dir).unwrap();
    let http = client();
    wait_until("sidecars", &mut proc, Duration::from_secs(60), || {
        http.get(format!("http://127.0.0.1:{admin}/ready"))
            .send()
            .is_ok_and(|r| r.status() == 200)
    })
    .unwrap();
    (proc, fronts)
}

fn healthy(http: &reqwest::blocking::Client, envoy: &Envoy, addr: &str) -> f64 {
    let text = http
        .get(envoy.admin_url("/stats/prometheus"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default();
    test_harness::cluster::metric_value(
        &text,
        &format!("prefix_router_pod_healthy{{pod=\"{addr}\"}}"),
    )
    .unwrap_or(-1.0)
}

#[test]
fn a_fleet_behind_mutual_tls_is_polled_and_routed_by_prefix() {
    let dir = run_dir("pod-tls");
    std::fs::create_dir_all(&dir).unwrap();
    test_harness::pki::certificates(&dir, NAME).unwrap();
    let pods = start_pods_of(PodKind::ModelServer, 2, &ZERO_COST, &dir).unwrap();
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    let (_sidecars, fronts) = sidecars(&dir, &addrs);
    let tls = PodTls {
        ca: dir.join("ca.crt"),
        sni: Some(NAME.into()),
        cert: Some((dir.join("client.crt"), dir.join("client.key"))),
    };
    let gateway = start_envoy(
        "gateway",
        &fronts,
        true,
        |s| s.pod_tls = Some(tls.clone()),
        &dir,
    )
    .unwrap();
    let http = client();
    let polled = (0..400).any(|_| {
        let ok = fronts.iter().all(|a| healthy(&http, &gateway, a) == 1.0);
        if !ok {
            std::thread::sleep(Duration::from_millis(50));
        }
        ok
    });
    assert!(polled, "the filter never polled the pods through TLS");
    let lead = "Rotate the leaked key, revoke the old one, and audit who used it since. ";
    let body = json!({"prompt": lead.repeat(30), "max_tokens": 1});
    let send = || {
        Answer::read(
            http.post(gateway.url("/v1/completions"))
                .json(&body)
                .send()
                .unwrap(),
        )
    };
    let first = send();
    assert_eq!(first.status, 200, "{}", first.body);
    let again = send();
    assert_eq!(
        (again.reason(), again.pod.as_str()),
        ("prefix-hit", first.pod.as_str())
    );
    assert!(again.cached() > 0);

    // the same gateway without its client certificate: the sidecars refuse it
    let no_cert = PodTls { cert: None, ..tls };
    let refused = start_envoy(
        "gateway-no-cert",
        &fronts,
        true,
        |s| s.pod_tls = Some(no_cert),
        &dir,
    )
    .unwrap();
    let down = (0..400).any(|_| {
        let all = fronts.iter().all(|a| healthy(&http, &refused, a) == 0.0);
        if !all {
            std::thread::sleep(Duration::from_millis(50));
        }
        all
    });
    assert!(down, "pods refusing the handshake should be marked down");
}
