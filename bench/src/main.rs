//! `bench`: prefix-router's benchmarks; see [`prefix_router_bench::cli`].

fn main() -> anyhow::Result<()> {
    prefix_router_bench::cli::main()
}
