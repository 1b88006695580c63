"""Make a user-item ratings file in the shape of GroupLens "Learning from Sets of Items" (2019) item_ratings.csv.

    python data/make_ratings.py                                   # the committed data/ratings/item_ratings.csv
    python data/make_ratings.py --users 40000 --items 10000 --ratings-per-user 100 --out /tmp/big.csv

Columns as in the real file: userId (an opaque hash string), movieId (a sparse MovieLens-style integer id),
rating (0.5 to 5.0 in half stars), timestamp (Unix seconds). The ratings are learnable: each user and
movie has a bias and a few latent taste factors, and

    rating = round_to_half_star(3.5 + user_bias + movie_bias + user_factors . movie_factors + noise)

Which movies a user rates follows a long-tailed popularity, as on MovieLens. The same arguments always
give the same file (fixed seed).
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

FIRST_TIMESTAMP = 1546300800  # 2019-01-01 UTC
LAST_TIMESTAMP = 1556668800  # 2019-05-01 UTC


def make_ratings(num_users: int, num_items: int, ratings_per_user: int, seed: int = 0, *, num_factors: int = 2,
                 user_bias_sd: float = 0.5, item_bias_sd: float = 0.7, taste_sd: float = 1.0,
                 noise_sd: float = 0.4, popularity_exponent: float = 0.8) -> pd.DataFrame:
    """Ratings with learnable structure; the standard deviations are in stars."""
    rng = np.random.default_rng(seed)
    user_bias = rng.normal(0.0, user_bias_sd, num_users)
    item_bias = rng.normal(0.0, item_bias_sd, num_items)
    user_factors = rng.normal(0.0, 1.0, (num_users, num_factors))
    item_factors = rng.normal(0.0, 1.0, (num_items, num_factors))
    taste_scale = taste_sd / np.sqrt(num_factors)

    # Who rates what: each user rates about ratings_per_user movies, popular movies far more often.
    counts = np.maximum(5, rng.poisson(ratings_per_user, num_users))
    popularity = 1.0 / np.arange(1, num_items + 1) ** popularity_exponent
    popularity = rng.permutation(popularity / popularity.sum())
    users = np.repeat(np.arange(num_users), counts)
    items = rng.choice(num_items, size=len(users), p=popularity)
    pairs = np.unique(users.astype(np.int64) * num_items + items)  # a user rates a movie once
    users, items = pairs // num_items, pairs % num_items

    score = (3.5 + user_bias[users] + item_bias[items]
             + taste_scale * np.einsum("nk,nk->n", user_factors[users], item_factors[items])
             + rng.normal(0.0, noise_sd, len(users)))
    rating = np.clip(np.round(score * 2) / 2, 0.5, 5.0)

    user_ids = np.array([hashlib.sha1(f"user-{seed}-{u}".encode()).hexdigest()[:12] for u in range(num_users)])
    movie_ids = np.sort(rng.choice(np.arange(1, 200_001), size=num_items, replace=False))
    timestamps = rng.integers(FIRST_TIMESTAMP, LAST_TIMESTAMP, len(users))
    frame = pd.DataFrame({"userId": user_ids[users], "movieId": movie_ids[items], "rating": rating,
                          "timestamp": timestamps})
    return frame.sort_values("timestamp", kind="stable").reset_index(drop=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--items", type=int, default=150)
    parser.add_argument("--ratings-per-user", type=int, default=55, help="on average, before duplicates are dropped")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "ratings" / "item_ratings.csv")
    args = parser.parse_args()
    frame = make_ratings(args.users, args.items, args.ratings_per_user, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    print(f"{args.out}: {len(frame)} ratings, {frame.userId.nunique()} users, {frame.movieId.nunique()} movies, "
          f"mean rating {frame.rating.mean():.2f}, {args.out.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
