"""A workspace's image registry credentials: set, list, show, delete (astraeus.server.registries)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import registries
from astraeus.server.routers.deps import Sess, WsCaller, now, tx
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.put("/registries/{host}", response_model=A.RegistryOut, response_model_exclude_unset=True,
            responses={201: {"model": A.RegistryOut, "description": "Created (200: replaced)"}})
def put_registry(host: str, c: WsCaller, s: Sess, body: registries.RegistryPut, response: Response):
    with tx(s):
        cred, created = registries.put(s, c, host, body, now())
        out = registries.view(cred, c.role)
    response.status_code = 201 if created else 200
    return out


@router.get("/registries", response_model=A.RegistryList, response_model_exclude_unset=True)
def list_registries(c: WsCaller, s: Sess):
    return {"items": [registries.view(x, c.role) for x in registries.listed(s, c)]}


@router.get("/registries/{host}", response_model=A.RegistryOut, response_model_exclude_unset=True)
def get_registry(host: str, c: WsCaller, s: Sess):
    return registries.view(registries.get(s, c, host), c.role)


@router.delete("/registries/{host}", response_model=A.RegistryDeleted, response_model_exclude_unset=True)
def delete_registry(host: str, c: WsCaller, s: Sess):
    with tx(s):
        host = registries.delete(s, c, host, now())
    return {"registry": host, "deleted": True}
