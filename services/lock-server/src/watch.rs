//! `GET /v1/locks/{key}/watch`: the key's state, then every change of its holder, in order
//! (docs/lock-api.md, "Watch"). How each backend follows a key is its own
//! ([`Backend::watch`](crate::store::Backend::watch): on PostgreSQL one feed per watched key per
//! process fed by lockdb's notifications, on etcd an etcd watch of the grant key).

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Error;
use crate::state::AppState;
pub use crate::store::Item;

/// Events a slow watcher may fall behind by before it is cut off (it reconnects, and starts again
/// from the key's state).
const BACKLOG: usize = 64;

/// Opens a watch of `key` (already validated): the receiver yields the state, then the changes,
/// and ends when the server's stream lifetime is over.
pub async fn open(state: &AppState, key: String) -> Result<mpsc::Receiver<Item>, Error> {
    let (tx, rx) = mpsc::channel(BACKLOG);
    let ends = Instant::now() + state.watch_max();
    state.repo().watch(state.feeds(), key, tx, ends).await?;
    Ok(rx)
}
