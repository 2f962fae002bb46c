//! A `tracing` layer that records events for tests: each event's level,
//! fields (`message` included), thread and the spans it belongs to with
//! their fields, outermost first.
//!
//! ```
//! use iwarp_capture::log::Capture;
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! let cap = Capture::default();
//! let subscriber = tracing_subscriber::registry().with(cap.clone());
//! tracing::subscriber::with_default(subscriber, || {
//!     let span = tracing::info_span!("conn", qp = 7);
//!     tracing::warn!(parent: &span, code = 2, "Terminate sent");
//! });
//! let recs = cap.records(|_| true);
//! assert_eq!(recs[0].message(), "Terminate sent");
//! assert_eq!(recs[0].field("code"), "2");
//! assert_eq!(recs[0].span("conn").and_then(|f| f.get("qp")).map(String::as_str), Some("7"));
//! ```

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Field names and their values as text (`Debug` for non-strings).
pub type Fields = BTreeMap<String, String>;

#[derive(Default)]
struct Collect(Fields);

impl Visit for Collect {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
}

/// One recorded event.
#[derive(Clone, Debug)]
pub struct Record {
    /// Its level.
    pub level: Level,
    /// Its fields, `message` included.
    pub fields: Fields,
    /// The thread that emitted it.
    pub thread: ThreadId,
    /// The spans it belongs to, outermost first: (name, fields).
    pub spans: Vec<(String, Fields)>,
}

impl Record {
    /// The `message` field ("" without one).
    pub fn message(&self) -> &str {
        self.field("message")
    }

    /// Field `name` ("" without one).
    pub fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }

    /// The fields of the innermost span called `name`.
    pub fn span(&self, name: &str) -> Option<&Fields> {
        self.spans
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, f)| f)
    }
}

/// The layer; clones share the records.
#[derive(Clone, Debug, Default)]
pub struct Capture(Arc<Mutex<Vec<Record>>>);

impl Capture {
    /// The records `keep` selects, in the order they were emitted.
    pub fn records(&self, keep: impl Fn(&Record) -> bool) -> Vec<Record> {
        let recs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        recs.iter().filter(|r| keep(r)).cloned().collect()
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut c = Collect::default();
        attrs.record(&mut c);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(c.0);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut c = Collect::default();
        event.record(&mut c);
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|s| {
                        let f = s.extensions().get::<Fields>().cloned().unwrap_or_default();
                        (s.name().to_string(), f)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let rec = Record {
            level: *event.metadata().level(),
            fields: c.0,
            thread: std::thread::current().id(),
            spans,
        };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
    }
}
