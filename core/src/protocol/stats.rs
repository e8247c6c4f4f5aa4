//! How the filter's per-pod metrics are named, and how Envoy turns the name into a label.
//!
//! Wasm metrics have no labels: a per-pod gauge carries the pod's address in its name,
//! `prefix_router_pod.<ip:port>.<gauge>`, and the Envoy config (written by
//! `render-envoy-config`) has a stats tag with [`POD_TAG_REGEX`] that cuts the address out of
//! the name into a `pod` tag. Prometheus then sees `prefix_router_pod_healthy{pod="…"}`, which
//! dashboards and rules can group and join on. An Envoy config without the tag still works;
//! its names then read `prefix_router_pod_10_0_0_5_8000_healthy`.

/// Name of one per-pod gauge (`healthy`, `inflight`, `event_lag_ms`, `signals`) of the pod at
/// `addr`, as the filter defines it.
pub fn pod_stat_name(addr: &str, gauge: &str) -> String {
    format!("prefix_router_pod.{addr}.{gauge}")
}

/// The Envoy stats tag's name.
pub const POD_TAG: &str = "pod";

/// The Envoy stats tag regex (`stats_config.stats_tags`): the first group is cut from the
/// name, the second is the tag's value. Envoy keeps wasm metrics under `wasmcustom.`.
pub const POD_TAG_REGEX: &str = r"^wasmcustom\.prefix_router_pod\.((.+)\.)[a-z_]+$";

#[cfg(test)]
mod tests {
    use super::*;

    /// What Envoy does with the tag: the first group leaves the name, the second is the value.
    fn extract(full: &str) -> Option<(String, String)> {
        let re = regex::Regex::new(POD_TAG_REGEX).ok()?;
        let c = re.captures(full)?;
        let cut = c.get(1)?;
        let name = format!("{}{}", &full[..cut.start()], &full[cut.end()..]);
        Some((name, c.get(2)?.as_str().to_owned()))
    }

    #[test]
    fn the_tag_takes_the_whole_address() {
        for addr in ["10.0.0.5:8000", "127.0.0.1:18001", "[::1]:8000"] {
            let full = format!("wasmcustom.{}", pod_stat_name(addr, "event_lag_ms"));
            assert_eq!(
                extract(&full),
                Some((
                    "wasmcustom.prefix_router_pod.event_lag_ms".to_owned(),
                    addr.to_owned()
                ))
            );
        }
        assert_eq!(
            extract("wasmcustom.prefix_router_pod_generation_changes"),
            None
        );
    }
}
