//! Repositories: thin functions that bind and run one statement from [`crate::sql`] each. They never
//! open or commit transactions (the posting component owns the one transaction of (a)(b)(c)) and never
//! decide what zero rows means: they return `Option`/`Vec` and the caller classifies.

pub mod account;
pub mod ledger;
pub mod payout;
pub mod recon;
