//! Pods that require an API key (vLLM's `--api-key`; this project's server has the same
//! flag): the filter's polls carry the key, read from an environment variable of Envoy's, so
//! the pods stay healthy and requests are routed by prefix; clients' own keys go through.
//! Without the key configured, the same pods answer the polls 401 and are marked down.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use serde_json::json;
use std::time::Duration;
use test_harness::cluster::start_envoy;
use test_harness::fleet::{Fleet, ZERO_COST};

const KEY_ENV: &str = "PREFIX_ROUTER_TEST_POD_KEY";

#[test]
fn an_authenticated_fleet_is_polled_with_its_key_and_routed_by_prefix() {
    let mut pod_args = ZERO_COST.to_vec();
    pod_args.extend(["--api-key", "s3cret"]);
    let f = Fleet::start("pod-credentials", 3, &pod_args, |s| {
        s.pod_api_key_env = Some(KEY_ENV.into());
        s.env = vec![(KEY_ENV.into(), "s3cret".into())];
    })
    .unwrap(); // waits until every pod has answered the filter's polls
    for p in &f.pods {
        assert_eq!(f.pod_stat(&f.envoy, "healthy", &p.addr), 1.0, "{}", p.name);
    }
    let lead = "Summarise the incident timeline, the customer impact and the follow-ups. ";
    let body = json!({"prompt": lead.repeat(30), "max_tokens": 1});
    let auth = [("authorization", "Bearer s3cret")];
    let first = f.send("/v1/completions", &body, &auth);
    assert_eq!(first.status, 200, "{}", first.body);
    let again = f.send("/v1/completions", &body, &auth);
    assert_eq!(again.status, 200);
    assert_eq!(again.pod, first.pod);
    assert_eq!(again.reason(), "prefix-hit");
    assert!(again.cached() > 0);
    // the client's own credentials decide at the pod: none is a 401 from it
    let anonymous = f.send("/v1/completions", &body, &[]);
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    assert_eq!(anonymous.body["error"]["code"], "invalid_api_key");
    // the key never reaches the Envoy config or its log
    let config = std::fs::read_to_string(&f.envoy.config_path).unwrap();
    assert!(!config.contains("s3cret"));
    assert!(!f.envoy.proc.log_tail().contains("s3cret"));

    // the same pods behind an Envoy that has no key: its polls are refused, pods marked down
    let bare = start_envoy("envoy-no-key", &f.addrs(), true, |_| {}, &f.dir).unwrap();
    let down = f.wait(Duration::from_secs(20), || {
        f.pods
            .iter()
            .all(|p| f.pod_stat(&bare, "healthy", &p.addr) == 0.0)
            && f.stat(&bare, "prefix_router_polls_failed") > 0.0
    });
    assert!(down, "pods that refuse the polls should be marked down");
}
