//! The members of an Envoy cluster, read from Envoy's own admin `GET /clusters?format=json`.
//!
//! Why from Envoy: the pods cluster may be STATIC, STRICT_DNS (a Kubernetes headless Service:
//! one host per ready pod IP) or EDS, and Envoy already resolves and updates it. Asking Envoy
//! which hosts it has means the filter routes to exactly the addresses the `override_host`
//! balancer accepts, learns joins and leaves without an Envoy restart, and needs no DNS of
//! its own (wasm has none). A wasm filter can reach the admin only through a cluster that
//! points at the admin address (127.0.0.1 inside the Envoy pod; no route leads to it).
//!
//! Only the fields needed are read; everything else in the (large) document is skipped.
//! `tests/data/envoy_clusters.json` is a real Envoy 1.40 answer (a STRICT_DNS cluster whose
//! `localhost` resolved to 127.0.0.1, and an EDS cluster fed from a file).

use serde::Deserialize;

#[derive(Deserialize)]
struct Clusters {
    #[serde(default)]
    cluster_statuses: Vec<ClusterStatus>,
}

#[derive(Deserialize)]
struct ClusterStatus {
    name: String,
    #[serde(default)]
    host_statuses: Vec<HostStatus>,
}

#[derive(Deserialize)]
struct HostStatus {
    address: Option<Address>,
    #[serde(default)]
    health_status: HealthStatus,
}

#[derive(Deserialize)]
struct Address {
    socket_address: Option<SocketAddress>,
}

#[derive(Deserialize)]
struct SocketAddress {
    address: String,
    #[serde(default)]
    port_value: u32,
}

#[derive(Deserialize, Default)]
struct HealthStatus {
    #[serde(default)]
    eds_health_status: Option<String>,
    #[serde(default)]
    failed_active_health_check: bool,
}

impl HostStatus {
    /// Whether the host takes new requests: not failing Envoy's own health check, and not
    /// marked unhealthy, draining or timed out by its discovery (Kubernetes puts a pod that is
    /// not ready, or terminating, in that state).
    fn serving(&self) -> bool {
        let h = &self.health_status;
        !h.failed_active_health_check
            && !matches!(
                h.eds_health_status.as_deref(),
                Some("UNHEALTHY" | "DRAINING" | "TIMEOUT")
            )
    }

    fn addr(&self) -> Option<String> {
        let s = self.address.as_ref()?.socket_address.as_ref()?;
        if s.port_value == 0 || s.port_value > u32::from(u16::MAX) {
            return None;
        }
        // Envoy's own spelling: what the destination header must name for `override_host`
        let ip: std::net::IpAddr = s.address.parse().ok()?;
        Some(std::net::SocketAddr::new(ip, s.port_value as u16).to_string())
    }
}

/// The serving members of `cluster` as `ip:port`, sorted, without duplicates. `Err` when the
/// document is not Envoy's cluster status or has no cluster of that name (a typo in the
/// configuration must not read as "no pods").
pub fn members_of(doc: &[u8], cluster: &str) -> Result<Vec<String>, String> {
    let c: Clusters = serde_json::from_slice(doc)
        .map_err(|e| format!("not Envoy's /clusters?format=json: {e}"))?;
    let status = c
        .cluster_statuses
        .iter()
        .find(|s| s.name == cluster)
        .ok_or_else(|| format!("Envoy has no cluster '{cluster}'"))?;
    let mut addrs: Vec<String> = status
        .host_statuses
        .iter()
        .filter(|h| h.serving())
        .filter_map(HostStatus::addr)
        .collect();
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_a_real_envoy_answer() {
        let doc = include_bytes!("../../tests/data/envoy_clusters.json");
        assert_eq!(
            members_of(doc, "pods").unwrap(),
            ["127.0.0.1:8001", "127.0.0.1:8002"],
            "STRICT_DNS: localhost resolved by Envoy"
        );
        assert_eq!(members_of(doc, "eds").unwrap(), ["127.0.0.1:9003"]);
        assert!(members_of(doc, "podz").unwrap_err().contains("'podz'"));
        assert!(members_of(b"<html>", "pods").is_err());
    }

    #[test]
    fn only_serving_hosts_are_members() {
        let host = |ip: &str, port: u32, health: serde_json::Value| json!({"address": {"socket_address": {"address": ip, "port_value": port}}, "health_status": health});
        let doc = json!({"cluster_statuses": [{"name": "pods", "host_statuses": [
            host("10.0.0.2", 8000, json!({"eds_health_status": "HEALTHY"})),
            host("10.0.0.1", 8000, json!({})),
            host("10.0.0.3", 8000, json!({"eds_health_status": "DRAINING"})),
            host("10.0.0.4", 8000, json!({"eds_health_status": "UNHEALTHY"})),
            host("10.0.0.5", 8000, json!({"failed_active_health_check": true})),
            host("10.0.0.6", 8000, json!({"eds_health_status": "DEGRADED"})),
            host("10.0.0.1", 8000, json!({})),
            host("not-an-ip", 8000, json!({})),
            host("10.0.0.7", 0, json!({})),
            host("::1", 8000, json!({})),
            {"address": {"pipe": {"path": "/tmp/s"}}},
        ]}]});
        assert_eq!(
            members_of(doc.to_string().as_bytes(), "pods").unwrap(),
            [
                "10.0.0.1:8000",
                "10.0.0.2:8000",
                "10.0.0.6:8000",
                "[::1]:8000"
            ]
        );
        let empty = json!({"cluster_statuses": [{"name": "pods"}]});
        assert_eq!(
            members_of(empty.to_string().as_bytes(), "pods").unwrap(),
            Vec::<String>::new()
        );
    }
}
