//! `model-server`: parse flags, bind, serve until SIGTERM/Ctrl-C.

use clap::Parser;
use model_server::{run, shutdown_signal, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = Config::parse();
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    run(config, listener, shutdown_signal()).await
}
