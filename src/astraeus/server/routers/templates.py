"""Run templates: create, list, show, replace, delete (astraeus.server.templates)."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import templates
from astraeus.server.routers.deps import Sess, WsCaller, now, tx
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.post("/templates", status_code=201, response_model=A.TemplateOut, response_model_exclude_unset=True)
def create_template(c: WsCaller, s: Sess, body: templates.TemplateBody):
    with tx(s):
        t = templates.create(s, c, body, now())
        out = templates.view(t, c)
    return out


@router.get("/templates", response_model=A.TemplateList, response_model_exclude_unset=True)
def list_templates(c: WsCaller, s: Sess):
    return {"items": [templates.view(t, c) for t in templates.listed(s, c)]}


@router.get("/templates/{name}", response_model=A.TemplateOut, response_model_exclude_unset=True)
def get_template(name: str, c: WsCaller, s: Sess):
    return templates.view(templates.get(s, c, name), c)


@router.put("/templates/{name}", response_model=A.TemplateOut, response_model_exclude_unset=True)
def replace_template(name: str, c: WsCaller, s: Sess, body: templates.TemplateBody):
    with tx(s):
        t = templates.replace(s, c, name, body, now())
        out = templates.view(t, c)
    return out


@router.delete("/templates/{name}", response_model=A.Deleted, response_model_exclude_unset=True)
def delete_template(name: str, c: WsCaller, s: Sess):
    with tx(s):
        templates.delete(s, c, name, now())
    return {"name": name, "deleted": True}
