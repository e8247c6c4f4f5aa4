//! An in-process model server on 127.0.0.1 (port 0) for the HTTP tests, readiness polled.

#![allow(dead_code)] // each test binary uses its own subset

use clap::Parser;
use model_server::{run, Config};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub http: reqwest::Client,
}

/// Starts a server with these flags and waits until `/health` answers.
pub async fn start_with(flags: &[&str]) -> Server {
    let mut args = vec!["model-server"];
    args.extend_from_slice(flags);
    let config = Config::try_parse_from(args).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(run(config, listener, async {
        let _ = rx.await;
    }));
    let http = reqwest::Client::new();
    // poll for readiness instead of sleeping
    for _ in 0..1000 {
        if let Ok(r) = http.get(format!("http://{addr}/health")).send().await {
            if r.status().is_success() {
                return Server {
                    addr,
                    stop: Some(stop),
                    task,
                    http,
                };
            }
        }
        if task.is_finished() {
            panic!("server exited: {:?}", task.await);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("server did not become healthy");
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value, reqwest::header::HeaderMap) {
        let r = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let v = r.json::<Value>().await.unwrap_or(Value::Null);
        (status, v, headers)
    }

    pub async fn post_raw(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let r = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        (
            status,
            r.json::<Value>().await.unwrap_or(Value::Null),
            headers,
        )
    }

    pub async fn cached(&self, path: &str, body: &Value) -> u64 {
        let (s, v, _) = self.post(path, body).await;
        assert_eq!(s, 200, "{v}");
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    }

    /// The samples of metric family `name` on `/metrics`: (value kind, value).
    async fn samples(&self, name: &str) -> Vec<(prom_text_format_parser::ValueType, f64)> {
        let text = self
            .http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let scrape = prom_text_format_parser::Scrape::parse(&text).unwrap();
        let metric = scrape.metrics.iter().find(|m| m.name == name);
        let metric = metric.unwrap_or_else(|| panic!("metric {name} not found in\n{text}"));
        metric
            .samples
            .iter()
            .map(|s| (s.value.value_type, s.value.value.as_f64()))
            .collect()
    }

    pub async fn metric(&self, name: &str) -> f64 {
        self.samples(name).await.iter().map(|(_, v)| v).sum()
    }

    /// A histogram's (count, sum).
    pub async fn histogram(&self, name: &str) -> (f64, f64) {
        use prom_text_format_parser::ValueType;
        let samples = self.samples(name).await;
        let of = |t: ValueType| {
            samples
                .iter()
                .filter(|(k, _)| *k == t)
                .map(|(_, v)| v)
                .sum()
        };
        (of(ValueType::Count), of(ValueType::Sum))
    }

    pub async fn token_count(&self, body: &Value) -> usize {
        let (s, v, _) = self.post("/tokenize", body).await;
        assert_eq!(s, 200, "{v}");
        v["count"].as_u64().unwrap() as usize
    }

    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }
}

/// The `data` of every server-sent event of a streamed response, in order.
pub async fn sse_data(r: reqwest::Response) -> Vec<String> {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    r.bytes_stream()
        .eventsource()
        .map(|e| e.unwrap().data)
        .collect()
        .await
}

/// Every server-sent event of a streamed response as (event name, data), in order.
pub async fn sse_events(r: reqwest::Response) -> Vec<(String, String)> {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    r.bytes_stream()
        .eventsource()
        .map(|e| {
            let e = e.unwrap();
            (e.event, e.data)
        })
        .collect()
        .await
}
