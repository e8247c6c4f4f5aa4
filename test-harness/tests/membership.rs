//! Pods that join and leave a running Envoy, with no restart and no failed request: the pods
//! cluster is fed from a watched EDS file (as a control plane would update it), or is a DNS
//! name Envoy resolves (as a Kubernetes headless Service is); the filter follows the members
//! through Envoy's own admin.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use prefix_core::protocol::headers::debug;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;
use test_harness::cluster::{pod_metric, run_dir, start_envoy, start_pods};
use test_harness::envoy_config::{write_eds, Membership};
use test_harness::fleet::{Fleet, ZERO_COST};
use test_harness::load::Load;

const POLL_MS: u64 = 200;

const LEAD: &str =
    "You are the release assistant. For every change, list the services it touches, \
the migrations it needs, the feature flags it flips and the dashboards to watch during rollout; \
say who must approve it and how to roll it back. Never skip the canary stage for a change that \
touches billing or authentication. Report as a checklist with one line per step. ";

fn prompt(tag: &str) -> Value {
    json!({"prompt": format!("{tag} {LEAD}{LEAD}"), "max_tokens": 2})
}

/// Requests served by a pod, from its own counter.
fn served(f: &Fleet, i: usize) -> f64 {
    pod_metric(
        &f.http,
        &f.pods[i].addr,
        "vllm:e2e_request_latency_seconds_count",
    )
    .unwrap()
}

#[test]
fn eds_members_join_and_leave_under_load_without_a_failed_request() {
    let dir = run_dir("members-eds");
    let pods = start_pods(3, &ZERO_COST, &dir).unwrap();
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    let eds = dir.join("eds").join("pods.yaml");
    std::fs::create_dir_all(eds.parent().unwrap()).unwrap();
    write_eds(&eds, &addrs[..2]).unwrap();
    let envoy = start_envoy(
        "envoy",
        &addrs,
        true,
        |s| {
            s.poll_interval_ms = POLL_MS;
            s.membership = Membership::EdsFile(eds.clone());
        },
        &dir,
    )
    .unwrap();
    let f = Fleet::of(pods, envoy, dir);
    let members = |n: f64| {
        f.wait(Duration::from_secs(20), || {
            f.stat(&f.envoy, "prefix_router_members") == n
        })
    };
    assert!(members(2.0), "the filter learned the two EDS members");

    let traffic = Load::start(f.envoy.url("/v1/completions"), 30.0, |i| {
        (prompt(&format!("change {i}")), false)
    });
    // a pod joins: it takes requests without an Envoy restart
    let before = served(&f, 2);
    write_eds(&eds, &addrs).unwrap();
    assert!(members(3.0), "the third pod joined");
    assert!(
        f.wait(Duration::from_secs(20), || served(&f, 2) > before),
        "the pod that joined serves requests"
    );
    // a pod leaves: nothing is sent to it any more
    write_eds(&eds, &addrs[1..]).unwrap();
    assert!(members(2.0), "the first pod left");
    let outcomes = traffic.finish();
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.failure.as_ref()).collect();
    assert!(
        failures.is_empty(),
        "{} sent, failures: {failures:?}",
        outcomes.len()
    );
    assert!(
        outcomes.len() > 20,
        "traffic flowed throughout ({})",
        outcomes.len()
    );
    let gone = served(&f, 0);
    for i in 0..20 {
        let a = f.send("/v1/completions", &prompt(&format!("after {i}")), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_ne!(
            a.header(debug::POD),
            addrs[0],
            "a pod that left is never chosen"
        );
    }
    assert_eq!(served(&f, 0), gone, "and never reached");
    assert!(
        f.stat(&f.envoy, "prefix_router_membership_changes") >= 3.0,
        "first list, join, leave"
    );
}

#[test]
fn dns_named_pods_are_resolved_by_envoy_and_routed_by_prefix() {
    let dir = run_dir("members-dns");
    let pods = start_pods(3, &ZERO_COST, &dir).unwrap();
    // `localhost:PORT`: names Envoy resolves (STRICT_DNS), as a headless Service would be
    let names: Vec<String> = pods
        .iter()
        .map(|p| p.addr.replace("127.0.0.1", "localhost"))
        .collect();
    let envoy = start_envoy(
        "envoy",
        &names,
        true,
        |s| {
            s.poll_interval_ms = POLL_MS;
            s.membership = Membership::Dns;
            s.dns_refresh = "1s".into();
        },
        &dir,
    )
    .unwrap();
    let f = Fleet::of(pods, envoy, dir);
    assert!(
        f.wait(Duration::from_secs(20), || {
            f.stat(&f.envoy, "prefix_router_members") == 3.0
                && f.pods
                    .iter()
                    .all(|p| f.pod_stat(&f.envoy, "signals", &p.addr) == 1.0)
        }),
        "the filter follows the three resolved pods"
    );
    let mut chosen = BTreeSet::new();
    for i in 0..4 {
        let a = f.send("/v1/completions", &prompt("same"), &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        chosen.insert(a.header(debug::POD).to_owned());
        let want = if i == 0 { "cold" } else { "prefix-hit" };
        assert_eq!(a.reason(), want, "send {i}");
    }
    assert_eq!(chosen.len(), 1, "one pod holds the prefix: {chosen:?}");
    let pod = chosen.into_iter().next().unwrap();
    assert!(
        f.addrs().contains(&pod),
        "the destination is the resolved address {pod}"
    );
}
