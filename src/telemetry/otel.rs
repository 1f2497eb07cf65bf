//! OpenTelemetry traces of the request path, exported over OTLP (gRPC or HTTP/protobuf).
//!
//! With `--tracing` (or the reference's `TRACING_ENABLED`), every `ShouldRateLimit` call,
//! over gRPC or `POST /json`, is a server span named after its entry point, carrying the
//! domain, the descriptor count, the result and the store; the store call is its child span
//! `store.apply`. The caller's trace context (W3C `traceparent`, else B3: see
//! [`propagation`]) is the parent, so floodgate's spans join Envoy's traces. Sampling is
//! parent-based: a caller's decision is followed; a request without one is sampled at
//! `--tracing-sampling-rate` (by trace id, so every service of a trace agrees).
//!
//! Cost. Off (the default), the request path tests one `Option` and does nothing else: no
//! header is read, no span built. On, finished spans go to the SDK's batch processor: a
//! bounded queue (`--tracing-queue-size`) drained by its own thread, so a slow or absent
//! collector never blocks a request; spans that find the queue full are dropped, and the
//! SDK logs that (once, then the total at shutdown). Each export runs on the main runtime
//! (`OnRuntime`), where the exporters' gRPC channel and HTTP client live. At shutdown,
//! [`Traces::shutdown`] flushes what is queued, within a deadline.
//!
//! The OpenTelemetry API is used directly rather than through `tracing-opentelemetry`:
//! exported spans are then independent of the log filter (`RUST_LOG` cannot switch spans
//! on or off, nor make every request build span fields), and "off" is a plain branch.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData,
    SpanExporter,
};

pub mod propagation;

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// OTLP over gRPC.
    Grpc,
    /// OTLP over HTTP, protobuf bodies.
    HttpProtobuf,
}

/// What the export pipeline needs, resolved from the settings (`settings::traces`).
#[derive(Clone, Debug, PartialEq)]
pub struct ExportConfig {
    /// How spans are sent.
    pub transport: Transport,
    /// The collector's URL; `None`: the `OTEL_EXPORTER_OTLP_*` variables, else localhost.
    pub endpoint: Option<String>,
    /// `service.name`.
    pub service_name: String,
    /// `service.namespace`; omitted when empty.
    pub service_namespace: String,
    /// `service.instance.id`; a random UUID when `None`.
    pub service_instance_id: Option<String>,
    /// The fraction of new traces sampled, 0 to 1.
    pub sampling_rate: f64,
    /// Whether a caller's sampling decision is followed.
    pub parent_based: bool,
    /// Spans waiting for export, at most.
    pub queue_size: usize,
}

/// The name of the gRPC server span, as OpenTelemetry's gRPC conventions spell it
/// (`package.Service/Method`).
pub const GRPC_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The name of the `POST /json` server span.
pub const JSON_SPAN: &str = "POST /json";
/// The name of the store call's span.
pub const STORE_SPAN: &str = "store.apply";
/// How long shutdown waits for queued spans to be exported.
pub const FLUSH_DEADLINE: Duration = Duration::from_secs(5);

/// Why traces cannot be exported as configured.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The OTLP exporter rejected its settings (a bad endpoint URL, bad headers).
    #[error("OTLP trace exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The tracer and its provider (the export pipeline).
#[derive(Debug)]
pub struct Traces {
    /// Builds the spans.
    tracer: SdkTracer,
    /// Owns the batch processor and the exporter; shut down once, at exit.
    provider: SdkTracerProvider,
}

impl Traces {
    /// The export pipeline `settings` ask for. Must run inside the main tokio runtime:
    /// exports are run there.
    pub fn start(settings: &ExportConfig) -> Result<Traces, TraceError> {
        let exporter = OnRuntime {
            exporter: Arc::new(exporter(settings)?),
            runtime: tokio::runtime::Handle::current(),
        };
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(settings.queue_size)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_sampler(sampler(settings))
            .with_resource(resource(settings))
            .with_span_processor(processor)
            .build();
        let tracer = provider.tracer("floodgate");
        Ok(Traces { tracer, provider })
    }

    /// Starts the server span of one request named `name`, a child of the caller's span
    /// found in `headers`, if any.
    pub fn request(&self, name: &'static str, headers: Option<&HeaderMap>) -> RequestSpan<'_> {
        let parent = match headers.and_then(propagation::remote_parent) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let builder = self.tracer.span_builder(name).with_kind(SpanKind::Server);
        let span = self.tracer.build_with_context(builder, &parent);
        RequestSpan {
            tracer: &self.tracer,
            cx: parent.with_span(span),
        }
    }

    /// Exports what is queued and stops the pipeline, within `deadline`.
    pub async fn shutdown(&self, deadline: Duration) {
        let provider = self.provider.clone();
        // Blocking (it waits for the batch thread), and the export it waits for runs on
        // this runtime: so on a blocking thread, never on the runtime's own.
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(deadline)).await;
        match done {
            Ok(Ok(())) => tracing::debug!("trace export flushed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "trace export not flushed at shutdown"),
            Err(e) => tracing::warn!(error = %e, "trace export shutdown failed"),
        }
    }
}

/// The server span of one request, open until [`RequestSpan::end`].
pub struct RequestSpan<'a> {
    tracer: &'a SdkTracer,
    /// The caller's context with this span in it: the parent of the store span.
    cx: Context,
}

impl RequestSpan<'_> {
    /// Starts the child span of the store call over `buckets` bucket operations.
    pub fn store_call(&self, store: &'static str, buckets: usize) -> StoreSpan {
        let builder = self
            .tracer
            .span_builder(STORE_SPAN)
            .with_kind(SpanKind::Internal);
        let mut span = self.tracer.build_with_context(builder, &self.cx);
        if span.is_recording() {
            span.set_attribute(KeyValue::new("ratelimit.store", store));
            span.set_attribute(KeyValue::new("ratelimit.buckets", count(buckets)));
        }
        StoreSpan { span }
    }

    /// Ends the span with what the request was and how it was answered: `result` is one of
    /// `ok`, `over_limit`, `invalid`, `store_error`; `error`, when it failed.
    pub fn end(
        self,
        domain: &str,
        descriptors: usize,
        result: &'static str,
        store: &'static str,
        error: Option<&dyn Display>,
    ) {
        let span = self.cx.span();
        if span.is_recording() {
            span.set_attribute(KeyValue::new("ratelimit.domain", domain.to_string()));
            span.set_attribute(KeyValue::new("ratelimit.descriptors", count(descriptors)));
            span.set_attribute(KeyValue::new("ratelimit.result", result));
            span.set_attribute(KeyValue::new("ratelimit.store", store));
            span.set_attribute(KeyValue::new("rpc.system", "grpc"));
            if let Some(error) = error {
                span.set_status(Status::error(error.to_string()));
            }
        }
        span.end();
    }
}

/// The store call's span, open until [`StoreSpan::end`].
pub struct StoreSpan {
    span: opentelemetry_sdk::trace::Span,
}

impl StoreSpan {
    /// Ends the span, marked failed with `error` if the store failed.
    pub fn end(mut self, error: Option<&dyn Display>) {
        if let Some(error) = error
            && self.span.is_recording()
        {
            self.span.set_status(Status::error(error.to_string()));
        }
        self.span.end();
    }
}

/// An attribute count: lossless up to `i64::MAX`.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The OTLP exporter for `settings`. Without `--tracing-endpoint` the exporter takes the
/// standard `OTEL_EXPORTER_OTLP_*` variables, then the protocol's localhost default.
fn exporter(settings: &ExportConfig) -> Result<opentelemetry_otlp::SpanExporter, TraceError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match settings.transport {
        Transport::Grpc => {
            let mut builder = builder.with_tonic();
            if let Some(endpoint) = &settings.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()?
        }
        Transport::HttpProtobuf => {
            let mut builder = builder
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_http_client(
                    opentelemetry_http::hyper::HyperClient::with_default_connector(
                        export_timeout(),
                        None,
                    ),
                );
            if let Some(endpoint) = &settings.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()?
        }
    };
    Ok(exporter)
}

/// The HTTP client's own deadline: the OTLP default of 10 s (the exporter applies
/// `OTEL_EXPORTER_OTLP_TIMEOUT` on top of it).
fn export_timeout() -> Duration {
    Duration::from_secs(10)
}

/// Parent-based ratio sampling, as the reference's (`ParentBased(TraceIDRatioBased(rate))`),
/// or the ratio alone when `OTEL_TRACES_SAMPLER` asked for a sampler that ignores parents.
fn sampler(settings: &ExportConfig) -> Sampler {
    let rate = settings.sampling_rate;
    let root = if rate >= 1.0 {
        Sampler::AlwaysOn
    } else if rate <= 0.0 {
        Sampler::AlwaysOff
    } else {
        Sampler::TraceIdRatioBased(rate)
    };
    if settings.parent_based {
        Sampler::ParentBased(Box::new(root))
    } else {
        root
    }
}

/// `service.name`, `service.namespace` (when set) and `service.instance.id` (a random one
/// when unset, as the reference does). Built from settings only: the SDK's environment
/// detectors are not used, the settings already read what applies.
fn resource(settings: &ExportConfig) -> Resource {
    let instance = settings
        .service_instance_id
        .clone()
        .unwrap_or_else(random_instance_id);
    let mut builder = Resource::builder_empty()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.instance.id", instance));
    if !settings.service_namespace.is_empty() {
        builder = builder.with_attribute(KeyValue::new(
            "service.namespace",
            settings.service_namespace.clone(),
        ));
    }
    builder.build()
}

/// A random UUID (version 4) from the SDK's random trace-id generator.
fn random_instance_id() -> String {
    use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
    let mut bytes = RandomIdGenerator::default().new_trace_id().to_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// An exporter whose exports run on a tokio runtime. The batch processor calls `export`
/// from its own thread with a plain executor; the gRPC channel and the HTTP client need
/// tokio's reactor and timers, which live on the main runtime.
#[derive(Debug)]
struct OnRuntime<E> {
    exporter: Arc<E>,
    runtime: tokio::runtime::Handle,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let exporter = self.exporter.clone();
        match self
            .runtime
            .spawn(async move { exporter.export(batch).await })
            .await
        {
            Ok(result) => result,
            // The runtime is shutting down: nothing can be sent any more.
            Err(e) => Err(OTelSdkError::InternalFailure(e.to_string())),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called once while the pipeline is built, before any export shares the exporter.
        if let Some(exporter) = Arc::get_mut(&mut self.exporter) {
            exporter.set_resource(resource);
        }
    }
}

#[cfg(test)]
mod tests;
