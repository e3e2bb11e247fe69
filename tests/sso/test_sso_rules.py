"""The pure parts of single sign-on: which roles a person's groups give, the refusal's wording, a new user's name."""

from __future__ import annotations

from astraeus.server.services.sso import refusal, roles_for, user_name_for


def test_the_highest_role_any_group_gives_wins_per_workspace():
    mapping = {"ml": {"vision": "viewer"}, "ml-leads": {"vision": "admin", "nlp": "editor"}, "ops": {"nlp": "viewer"}}
    assert roles_for(["ml", "ml-leads", "ops"], mapping) == {"nlp": "editor", "vision": "admin"}
    assert roles_for(["ops"], mapping) == {"nlp": "viewer"}
    assert roles_for(["nobody"], mapping) == {}


def test_the_refusal_names_the_person_and_the_groups():
    assert refusal("carol@example.org", ["x", "y"]).startswith(
        "Signed in as carol@example.org, but none of your groups (x, y) is given a role here: ask an admin to map one")
    assert "(none)" in refusal("dan", [])


def test_a_new_users_name_is_a_free_dns_label():
    assert user_name_for({"preferred_username": "Alice.Example"}, set()) == "alice-example"
    assert user_name_for({"email": "bob@example.org"}, {"bob"}) == "bob-2"
    assert user_name_for({"email": "42@example.org"}, set()) == "u-42"
