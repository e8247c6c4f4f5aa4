//! `render-envoy-config`: see [`prefix_router_config::cli`].

fn main() -> anyhow::Result<()> {
    prefix_router_config::cli::run(<prefix_router_config::cli::Args as clap::Parser>::parse())
}
